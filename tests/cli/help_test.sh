#!/usr/bin/env bash
# Every subcommand's --help groups its options and gives every option a help line: CLI11 prints an
# option's signature from column 2 and its description from column 30, on the same line or the next.
set -euo pipefail
remat="$1"
status=0
for command in train plan policies profile estimate demo bench trace worker; do
  "$remat" "$command" --help > /tmp/remat-help-$$.txt 2>&1 || { echo "FAIL: $command --help exited with $?"; status=1; continue; }
  python3 - "$command" /tmp/remat-help-$$.txt <<'PY' || status=1
import sys
command, path = sys.argv[1], sys.argv[2]
lines = open(path).read().splitlines()
bad, options, groups = [], 0, 0
for i, line in enumerate(lines):
    if line and not line.startswith(" ") and line.endswith(":") and line.lower() != "options:":
        groups += 1
    # CLI11 2.4 prints "  -h,--help", 2.6 "  -h,     --help" and "          --json": a signature
    # starts before the description column.
    signature = line.lstrip(" ")
    if not signature.startswith("-") or len(line) - len(signature) >= 30:
        continue
    options += 1
    same = len(line) > 30 and line[29] == " " and line[30] != " "
    following = i + 1 < len(lines) and lines[i + 1].startswith(" " * 30) and lines[i + 1][30:31] not in ("", " ")
    if not (same or following):
        bad.append(line.strip())
if bad:
    print(f"FAIL: remat {command} --help: options without a help line: {bad}")
    sys.exit(1)
if options < 2 or (command != "policies" and groups < 2):
    print(f"FAIL: remat {command} --help: {options} options in {groups} groups")
    sys.exit(1)
print(f"remat {command}: {options} options, {groups} groups, each with a help line")
PY
done
rm -f /tmp/remat-help-$$.txt
exit $status
