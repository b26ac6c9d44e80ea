#!/usr/bin/env bash
# Data parallel on one machine: 2 processes x 1 thread against 1 process x 2 threads, the same
# global batch (8 sequences of the reference GPT) per step; tokens/s over all ranks, scaling
# efficiency (tokens/s against the 1-process run's), the fraction of step time spent waiting for
# gradients after backward, with the all-reduce overlapping backward (25 MiB and 4 MiB buckets) or
# not. Runs alternate, ROUNDS times each (default 2), and the table gives each setting's median.
#   bench/distributed_bench.sh [build/tools/remat] [steps per run, default 8] [extra train flags]
set -euo pipefail
remat="${1:-build/tools/remat}"
steps="${2:-8}"
shift $(( $# > 2 ? 2 : $# )) || true
rounds="${ROUNDS:-2}"
common=(train --preset reference --steps "$steps" --sample 0 --json "$@")
declare -A settings=(
  ["1 process x 2 threads, batch 8"]="--threads 2 --batch 8"
  ["2 ranks x 1 thread, batch 4 each, overlap, 25 MiB buckets"]="--nproc 2 --threads 1 --batch 4"
  ["2 ranks x 1 thread, batch 4 each, overlap, 4 MiB buckets"]="--nproc 2 --threads 1 --batch 4 --bucket-mib 4"
  ["2 ranks x 1 thread, batch 4 each, no overlap"]="--nproc 2 --threads 1 --batch 4 --no-overlap"
)
order=("1 process x 2 threads, batch 8" "2 ranks x 1 thread, batch 4 each, overlap, 25 MiB buckets"
       "2 ranks x 1 thread, batch 4 each, overlap, 4 MiB buckets" "2 ranks x 1 thread, batch 4 each, no overlap")
results="$(mktemp)"
trap 'rm -f "$results"' EXIT
for round in $(seq "$rounds"); do
  for name in "${order[@]}"; do
    # shellcheck disable=SC2086
    "$remat" "${common[@]}" ${settings[$name]} 2> /dev/null |
      /usr/bin/python3 -c 'import json, sys; d = json.load(sys.stdin); print(sys.argv[1] + "\t" + str(d["tokens_per_second"]) + "\t" + str(d["communication_fraction"]) + "\t" + str(d["step_seconds_median"]))' "$name" >> "$results"
    echo "round $round: $name done" >&2
  done
done
/usr/bin/python3 - "$results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, tps, comm, step = line.rstrip("\n").split("\t")
    rows.setdefault(name, []).append((float(tps), float(comm), float(step)))
base = statistics.median(r[0] for r in rows["1 process x 2 threads, batch 8"])
print("| setting | tokens/s (all ranks) | scaling efficiency | median step (s) | waiting for gradients |")
print("|---|---:|---:|---:|---:|")
for name, values in rows.items():
    tps = statistics.median(v[0] for v in values)
    print(f"| {name} | {tps:.0f} | {100 * tps / base:.0f}% | {statistics.median(v[2] for v in values):.3f} | "
          f"{100 * statistics.median(v[1] for v in values):.1f}% |")
PY
