"""The per-call overhead of a checkpoint on a tiny function (16 floats, (in*w).tanh(), as
bench/checkpoint_bench.cpp): PyTorch's measured here, remat's by running remat_checkpoint_bench."""
import json
import os
import statistics
import subprocess
import time

import torch
from torch.utils.checkpoint import checkpoint

from .common import fail, log


def seconds_per_call(calls, f):
    start = time.perf_counter()
    for _ in range(calls):
        f()
    return (time.perf_counter() - start) / calls


def pytorch_overhead(calls, rounds):
    torch.manual_seed(0)
    w = torch.randn(16, requires_grad=True)
    x = torch.randn(16, requires_grad=True)

    def tiny(inp):
        return (inp * w).tanh()

    cases = {
        "forward_direct": lambda: tiny(x),
        "forward_reentrant": lambda: checkpoint(tiny, x, use_reentrant=True),
        "forward_nonreentrant": lambda: checkpoint(tiny, x, use_reentrant=False),
        "step_direct": lambda: tiny(x).sum().backward(),
        "step_reentrant": lambda: checkpoint(tiny, x, use_reentrant=True).sum().backward(),
        "step_nonreentrant": lambda: checkpoint(tiny, x, use_reentrant=False).sum().backward(),
    }
    times = {k: [] for k in cases}
    for _ in range(rounds):
        for k, f in cases.items():
            times[k].append(seconds_per_call(calls, f))
    us = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    rows = []
    for mode in ("forward", "step"):
        for variant in ("reentrant", "nonreentrant"):
            rows.append({"who": f"PyTorch checkpoint, use_reentrant={variant == 'reentrant'}", "mode": mode,
                         "direct_us": us[f"{mode}_direct"], "checkpoint_us": us[f"{mode}_{variant}"]})
    return rows


def remat_overhead(build, calls, rounds, threads, workdir):
    bench = os.path.join(build, "bench", "remat_checkpoint_bench")
    if not os.path.exists(bench):
        fail(f"{bench} not found: build the project first: scripts/build.sh (or --no-overhead)")
    path = os.path.join(workdir, "checkpoint_bench.json")
    command = [bench, "--skip-stack", "--calls", str(calls), "--rounds", str(rounds), "--threads", str(threads),
               "--json", path]
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        fail(f"`{' '.join(command)}` failed (an old build without --skip-stack? rebuild it: "
             f"cd build && make remat_checkpoint_bench):\n{done.stderr.strip()}")
    with open(path) as f:
        j = json.load(f)
    rows = [{"who": "remat::checkpoint", "mode": mode, "direct_us": j[f"tiny_{mode}_direct_us"],
             "checkpoint_us": j[f"tiny_{mode}_checkpoint_us"]} for mode in ("forward", "step")]
    rows += [{"who": "remat::checkpoint, non-reentrant", "mode": mode, "direct_us": j[f"tiny_{mode}_direct_us"],
              "checkpoint_us": j[f"tiny_{mode}_checkpoint_nonreentrant_us"]}
             for mode in ("forward", "step") if f"tiny_{mode}_checkpoint_nonreentrant_us" in j]
    return rows


def measure_overhead(args, workdir):
    log(f"per-call overhead: {args.overhead_rounds} rounds of {args.overhead_calls} calls, remat then PyTorch")
    rows = remat_overhead(args.build, args.overhead_calls, args.overhead_rounds, args.threads, workdir)
    rows += pytorch_overhead(args.overhead_calls, args.overhead_rounds)
    for r in rows:
        r["overhead_us"] = r["checkpoint_us"] - r["direct_us"]
    return sorted(rows, key=lambda r: (r["mode"], not r["who"].startswith("remat::checkpoint"), r["who"]))
