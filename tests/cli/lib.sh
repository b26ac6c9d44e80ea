# Sourced by the CLI tests: `remat` (the binary, $1), a scratch folder removed on exit, a tiny GPT's
# flags, and `fail`.
set -euo pipefail
remat="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tiny=(--layers 2 --hidden 32 --heads 2 --seq 16 --batch 2)
fail() { echo "FAIL: $*" >&2; exit 1; }
