# Sourced by the CLI tests: `remat` (the binary, $1), a scratch folder removed on exit, a tiny GPT's
# flags, `fail`, and `expect_error`.
set -euo pipefail
remat="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tiny=(--layers 2 --hidden 32 --heads 2 --seq 16 --batch 2)
fail() { echo "FAIL: $*" >&2; exit 1; }
# expect_error TEXT COMMAND...: the command fails, within $error_seconds (60 unless set), saying TEXT;
# prints what it said.
expect_error() {
  local text="$1"; shift
  local out status=0 seconds=${error_seconds:-60}
  out=$(timeout "$seconds" "$@" 2>&1) || status=$?
  [ "$status" -ne 0 ] || fail "succeeded, expected an error: $*"
  [ "$status" -ne 124 ] || fail "hung (killed after $seconds s): $*"
  grep -qF -- "$text" <<< "$out" || fail "expected '$text' from $*; got: ${out:0:600}"
  printf '%s' "$out"
}
