#!/usr/bin/env python3
"""Runs `remat train --compare` once per policy and prints a Markdown table: activation peak,
memory saved vs `none`, step-time ratio vs `none` (each policy measured interleaved with its own
`none` steps, so machine drift hits both alike).

    bench/policy_table.py [--remat build/tools/remat] [--steps 3] [--compare-steps 3] [-- extra train flags]
"""
import argparse
import json
import subprocess
import sys

POLICIES = ["block", "every:2", "every:4", "segments:2", "segments:4", "sqrt", "ffn", "attn", "ffn+attn",
            "core-attn", "matmul-inputs", "block,skip-ends", "every:2,skip-ends", "ffn,skip-ends"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--remat", default="build/tools/remat")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--compare-steps", type=int, default=3)
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-free list separated by ';'")
    parser.add_argument("extra", nargs="*", help="flags passed to remat train (default: --preset reference)")
    args = parser.parse_args()
    policies = args.policies.split(";") if ";" in args.policies else POLICIES
    extra = args.extra or ["--preset", "reference"]
    rows = []
    for i, policy in enumerate(policies):
        print(f"[{i + 1}/{len(policies)}] {policy}", file=sys.stderr, flush=True)
        command = [args.remat, "train", *extra, "--policy", policy, "--steps", str(args.steps), "--compare",
                   "--measure-steps", str(args.compare_steps), "--sample", "0", "--json"]
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if done.returncode != 0:
            sys.exit(f"failed: {' '.join(command)}")
        report = json.loads(done.stdout)
        c = report["compare"]
        rows.append((policy, c["plan_activation_peak_bytes"], c["none_activation_peak_bytes"],
                     c["memory_saved_fraction"], c["step_time_ratio"], report["plan"]))
    print("| policy | activation peak (MiB) | saved vs none | step time vs none | plan |")
    print("|---|---:|---:|---:|---|")
    none_peak = rows[0][2] if rows else 0
    print(f"| none | {none_peak / 2**20:.1f} | 0.0% | 1.00x | (every stage plain) |")
    for policy, peak, _, saved, ratio, plan in rows:
        print(f"| {policy} | {peak / 2**20:.1f} | {100 * saved:.1f}% | {ratio:.2f}x | `{plan}` |")


if __name__ == "__main__":
    main()
