#!/usr/bin/python3
"""remat and PyTorch's torch.utils.checkpoint side by side on the same GPT, the same weights and the
same batch: exact activation peaks, step times and losses, interleaved step by step.

    bench/pytorch_side_by_side.py [--preset reference | --layers 8 --hidden 256 --heads 8 --seq 256
                                   --batch 8 --dropout 0.1] [--policies none,block,...] [--rounds 3]
                                  [--non-reentrant] [--no-overhead] [--json FILE] [--markdown FILE]

Needs the built project (scripts/build.sh): build/tools/remat, build/libremat_memory_tracker.so and,
for the per-call overhead, build/bench/remat_checkpoint_bench; and Debian's python3-torch 1.13.1, the
same LibTorch remat links.

How it works:
- The remat side is `remat worker`, a separate process. It builds the GPT (seeded), exports its
  weights and one batch of its corpus (torch.load-able), then runs one measured training step per
  request line on stdin under a policy's plan and answers one JSON line.
- This process builds the same GPT in PyTorch (models/src/gpt.cpp, op for op, with the same dropout
  calls in the same order and the same tensor lifetimes), loads the exported weights and batch, asks
  `remat plan --policy P --json` for each policy's plan and runs it generically: a
  {"checkpoint": [...]} item becomes torch.utils.checkpoint.checkpoint over the inner items (nested
  checkpoints inside, as remat recomputes them). Main comparison: use_reentrant=True (1.13's
  default); --non-reentrant adds use_reentrant=False.
- Bytes come from remat's tracking allocator loaded into this process (ctypes), under the
  conditions remat's programs set for themselves: --threads OpenBLAS threads and one LibTorch
  intra-op thread, freed memory kept in the process (glibc tunables; the script re-executes itself).
  Activation peak = peak during forward + backward minus the bytes held before the forward, with
  the gradients existing and zeroed, as remat::measure_step counts.
- One warm-up round (not counted), then --rounds rounds; in each, for each policy, one remat step
  and one PyTorch step, alternating which goes first. Both sides seed the CPU generator with the
  same seed right before the forward, so dropout masks, and hence losses, must be equal: the script
  exits with status 1 if any relative loss difference exceeds --loss-tolerance (1e-5).
- The per-call overhead of a checkpoint on a tiny function (16 floats, (in*w).tanh(), as
  bench/checkpoint_bench.cpp): PyTorch's measured here, remat's by running remat_checkpoint_bench.
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TUNABLES = "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=1073741824"
PRESETS = {
    "demo": dict(layers=4, hidden=128, heads=4, seq=128, batch=8, dropout=0.1),
    "reference": dict(layers=8, hidden=256, heads=8, seq=256, batch=8, dropout=0.1),
}
DEFAULT_POLICIES = "none,block,every:2,segments:2,segments:4,ffn,attn"
MIB = 2.0 ** 20


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), help="model and batch of `remat --preset`; flags override")
    for name, default in PRESETS["reference"].items():
        p.add_argument("--" + name, type=type(default), default=None, help=f"(default {default})")
    p.add_argument("--policies", default=None,
                   help=f"comma-separated (default {DEFAULT_POLICIES}, less those the model is too small for)")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds after one warm-up round")
    p.add_argument("--seed", type=int, default=0, help="the worker's seed (weights, batch); dropout seeds follow")
    p.add_argument("--threads", type=int, default=2, help="OpenBLAS threads, both sides (default 2)")
    p.add_argument("--non-reentrant", action="store_true", help="also time PyTorch's use_reentrant=False")
    p.add_argument("--no-overhead", action="store_true", help="skip the per-call overhead benchmark")
    p.add_argument("--overhead-calls", type=int, default=2000, help="calls per round of the overhead benchmark")
    p.add_argument("--overhead-rounds", type=int, default=7)
    # OpenBLAS threads spin 2^28 cycles (~0.1 s at 2.6 GHz) after their last call before sleeping:
    # pausing longer keeps one process's spinning threads out of the other's measured step.
    p.add_argument("--settle", type=float, default=0.25,
                   help="seconds to pause between steps so the other process's BLAS threads go idle (default 0.25)")
    p.add_argument("--loss-tolerance", type=float, default=1e-5, help="largest relative loss difference allowed")
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build directory")
    p.add_argument("--json", metavar="FILE", help="write all figures as JSON")
    p.add_argument("--markdown", metavar="FILE", help="write the tables as Markdown")
    args = p.parse_args()
    preset = PRESETS[args.preset or "reference"]
    for name, default in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    args.policies_given = args.policies is not None
    args.policies = [x.strip() for x in (args.policies or DEFAULT_POLICIES).split(",") if x.strip()]
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.hidden % args.heads:
        p.error(f"--heads ({args.heads}) must divide --hidden ({args.hidden})")
    return args


def reexec_under_remat_conditions():
    """Keep freed memory in the process (remat's mallopt calls as glibc tunables); BLAS threads."""
    if os.environ.get("GLIBC_TUNABLES") == TUNABLES:
        return
    os.environ["GLIBC_TUNABLES"] = TUNABLES
    threads = "2"
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            threads = sys.argv[i + 1]
        elif a.startswith("--threads="):
            threads = a.split("=", 1)[1]
    os.environ["OPENBLAS_NUM_THREADS"] = threads
    os.execv(sys.executable, [sys.executable] + sys.argv)


def log(message):
    print(message, file=sys.stderr, flush=True)


def fail(message):
    log(f"pytorch_side_by_side: {message}")
    sys.exit(2)


reexec_under_remat_conditions()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402


# ---------------------------------------------------------------------------------------------
# The GPT of models/src/gpt.cpp. Same ops, same dropout calls in the same order (embed; per block:
# attention probabilities, attention projection, MLP), same local-variable lifetimes (they decide
# which temporaries are alive at the peak).

class Block(nn.Module):
    def __init__(self, hidden, heads, seq, dropout):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)
        self.register_buffer("causal_mask", torch.ones(seq, seq, dtype=torch.bool).triu(1), persistent=False)

    def core_attention(self, qkv_out):
        b, t, c = qkv_out.shape[0], qkv_out.shape[1], qkv_out.shape[2] // 3
        hs = c // self.heads
        split = qkv_out.split(c, 2)
        q = split[0].view(b, t, self.heads, hs).transpose(1, 2)  # (B,NH,T,HS)
        k = split[1].view(b, t, self.heads, hs).transpose(1, 2)
        v = split[2].view(b, t, self.heads, hs).transpose(1, 2)
        scores = q.matmul(k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B,NH,T,T)
        scores = scores.masked_fill(self.causal_mask[:t, :t], float("-inf"))
        probs = scores.softmax(-1)
        probs = F.dropout(probs, self.dropout, self.training)
        return probs.matmul(v).transpose(1, 2).contiguous().view(b, t, c)  # (B,T,C)

    def attention_half(self, x):
        qkv_out = self.qkv(self.ln1(x))
        attended = self.core_attention(qkv_out)
        return x + F.dropout(self.proj(attended), self.dropout, self.training)

    def mlp_half(self, x):
        out = self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return x + F.dropout(out, self.dropout, self.training)


class GPT(nn.Module):
    def __init__(self, layers, hidden, heads, seq, dropout, vocabulary=256):  # bytes, as remat's corpus
        super().__init__()
        self.dropout = dropout
        self.wte = nn.Embedding(vocabulary, hidden)
        self.wpe = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, seq, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocabulary, bias=False)

    def embed(self, tokens):
        positions = torch.arange(tokens.shape[1])
        x = self.wte(tokens) + self.wpe(positions)
        return F.dropout(x, self.dropout, self.training)

    def loss(self, x, targets):
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def cpp_name(python_name):
    """blocks.3.qkv.weight -> block3.qkv.weight (the C++ module path)."""
    if python_name.startswith("blocks."):
        _, index, rest = python_name.split(".", 2)
        return f"block{index}.{rest}"
    return python_name


def load_export(model, path, args):
    """Copies the worker's exported weights into `model`; returns (tokens, targets)."""
    try:
        export = torch.load(path)
    except Exception as e:  # noqa: BLE001 - any unpickling failure is the same user-facing error
        fail(f"cannot load the worker's export {path}: {e}")
    if not isinstance(export, dict) or not {"weights", "tokens", "targets"} <= set(export):
        fail(f"{path}: expected a dict with 'weights', 'tokens' and 'targets', got "
             f"{sorted(export) if isinstance(export, dict) else type(export).__name__}")
    weights = dict(export["weights"])
    ours = {cpp_name(n): p for n, p in model.named_parameters()}
    problems = [f"missing in the export: {n}" for n in sorted(set(ours) - set(weights))]
    problems += [f"not in the PyTorch model: {n}" for n in sorted(set(weights) - set(ours))]
    problems += [f"{n}: export {tuple(weights[n].shape)}, PyTorch {tuple(p.shape)}"
                 for n, p in sorted(ours.items()) if n in weights and weights[n].shape != p.shape]
    if problems:
        fail("the exported weights do not match the PyTorch GPT:\n  " + "\n  ".join(problems))
    with torch.no_grad():
        for n, p in ours.items():
            p.copy_(weights[n])
    tokens, targets = export["tokens"], export["targets"]
    for name, t in (("tokens", tokens), ("targets", targets)):
        if t.dtype != torch.int64 or tuple(t.shape) != (args.batch, args.seq):
            fail(f"export's {name}: expected int64 of shape ({args.batch}, {args.seq}), got {t.dtype} {tuple(t.shape)}")
    return tokens.contiguous(), targets.contiguous()


# ---------------------------------------------------------------------------------------------
# Plans: remat's JSON, executed generically.

def remat_model_flags(args):
    return ["--layers", str(args.layers), "--hidden", str(args.hidden), "--heads", str(args.heads),
            "--seq", str(args.seq), "--batch", str(args.batch), "--dropout", repr(args.dropout)]


def get_plan(remat, args, policy):
    """The policy's plan as remat's JSON; None for a default policy the model is too small for."""
    command = [remat, "plan", *remat_model_flags(args), "--policy", policy, "--json"]
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0 and not args.policies_given:
        log(f"  skipping {policy}: {done.stderr.strip()}")
        return None
    if done.returncode != 0:
        fail(f"`{' '.join(command)}` failed:\n{done.stderr.strip()}")
    plan = json.loads(done.stdout)
    bad = sorted({o for o in plan["options"] if o != "full"})
    if bad:
        fail(f"policy {policy}: its plan uses stage option(s) {', '.join(bad)}, which exist only in remat's "
             "C++ model; PyTorch's checkpoint can only run plans whose options are all 'full'.")
    return plan


def compact(items):
    """The compact form of remat/plan.h (options omitted: all 'full')."""
    return " ".join(i if isinstance(i, str) else "[" + compact(i["checkpoint"]) + "]" for i in items)


def stage_functions(model, plan, targets):
    """Stage name -> function of the previous stage's output, as GptChain::forward_stage."""
    stages = {"embed": model.embed, "head": lambda x: model.loss(x, targets)}
    for i, block in enumerate(model.blocks):
        stages[f"block{i}"] = lambda x, b=block: b.mlp_half(b.attention_half(x))
        stages[f"attn{i}"] = block.attention_half
        stages[f"mlp{i}"] = block.mlp_half
    unknown = [s for s in plan["stages"] if s not in stages]
    if unknown:
        fail(f"the plan has stages this script does not know: {', '.join(unknown)}")
    return stages


def run_items(items, x, stages, reentrant):
    for item in items:
        if isinstance(item, str):
            x = stages[item](x)
        else:
            inner = item["checkpoint"]
            if reentrant and not x.requires_grad:
                fail("the plan checkpoints a segment whose input does not require grad (the embed stage?): "
                     "PyTorch's reentrant checkpoint would give its parameters no gradient.")
            x = checkpoint(lambda y, inner=inner: run_items(inner, y, stages, reentrant), x, use_reentrant=reentrant)
    return x


# ---------------------------------------------------------------------------------------------
# Measurement.

class Tracker:
    """remat's tracking allocator, installed as LibTorch's CPU allocator of this process."""

    def __init__(self, path):
        if not os.path.exists(path):
            fail(f"{path} not found: build the project first: scripts/build.sh")
        lib = ctypes.CDLL(path)
        lib.remat_cpu_current_bytes.restype = ctypes.c_int64
        lib.remat_cpu_peak_bytes.restype = ctypes.c_int64
        lib.remat_install_cpu_memory_tracker()
        self.lib = lib

    def current(self):
        return self.lib.remat_cpu_current_bytes()

    def peak(self):
        return self.lib.remat_cpu_peak_bytes()

    def reset_peak(self):
        self.lib.remat_cpu_reset_peak()


def pytorch_step(model, plan, stages, tokens, seed, reentrant, tracker):
    model.zero_grad(set_to_none=False)
    torch.manual_seed(seed)
    before = tracker.current()
    tracker.reset_peak()
    start = time.perf_counter()
    loss = run_items(plan["plan"], tokens, stages, reentrant)
    loss.backward()
    seconds = time.perf_counter() - start
    peak = tracker.peak() - before
    return {"seconds": seconds, "activation_peak_bytes": peak, "loss": loss.item()}


class Worker:
    """`remat worker`: one JSON request line in, one JSON reply line out."""

    def __init__(self, remat, args, export_path):
        command = [remat, "worker", *remat_model_flags(args), "--seed", str(args.seed),
                   "--threads", str(args.threads), "--export", export_path]
        self.command = " ".join(command)
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.ready = self.read_reply()
        if not self.ready.get("ready"):
            self.die(f"expected a ready line, got {self.ready}")

    def die(self, message):
        self.close()
        fail(f"remat worker ({self.command}): {message}")

    def read_reply(self):
        while True:
            line = self.process.stdout.readline()
            if not line:
                code = self.process.wait()
                self.die(f"exited with status {code} without replying (its messages are above)")
            line = line.strip()
            if not line.startswith("{"):
                log(f"  worker: {line}")
                continue
            try:
                reply = json.loads(line)
            except json.JSONDecodeError:
                self.die(f"replied with a line that is not JSON: {line!r}")
            if "error" in reply:
                self.die(f"error: {reply['error']}")
            return reply

    def step(self, policy, seed):
        try:
            self.process.stdin.write(json.dumps({"policy": policy, "steps": 1, "seed": seed}) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            self.read_reply()  # reports how it ended
        reply = self.read_reply()
        for key in ("seconds", "activation_peak_bytes", "loss"):
            if not isinstance(reply.get(key), list) or len(reply[key]) != 1:
                self.die(f"reply without a one-element '{key}' list: {reply}")
        return {"seconds": reply["seconds"][0], "activation_peak_bytes": reply["activation_peak_bytes"][0],
                "loss": reply["loss"][0], "plan": reply.get("plan")}

    def close(self):
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()


def get_plans(remat, args):
    plans = {}
    for policy in args.policies:
        plan = get_plan(remat, args, policy)
        if plan is not None:
            plans[policy] = plan
            log(f"plan {policy}: {compact(plan['plan'])}")
    return plans


def build_pytorch_model(args, export_path):
    """The PyTorch GPT with the worker's weights, gradients allocated; returns (model, tokens, targets)."""
    model = GPT(args.layers, args.hidden, args.heads, args.seq, args.dropout)
    model.train()
    tokens, targets = load_export(model, export_path, args)
    for p in model.parameters():  # gradients exist (zeroed) before every measured forward, as in remat
        p.grad = torch.zeros_like(p)
    return model, tokens, targets


def run_round(round_index, args, plans, worker, model, tokens, targets, tracker, variants):
    """One step per side and policy, all with the same dropout seed; returns {policy: {side: step}}."""
    seed = args.seed + 1000 + round_index + 1
    log(f"round {'warm-up' if round_index < 0 else f'{round_index + 1}/{args.rounds}'} (dropout seed {seed})")
    sides = [("remat", None)] + variants
    if round_index % 2 == 1:  # alternate who goes first: PyTorch in rounds -1 (warm-up), 1, 3, ...
        sides = variants + [("remat", None)]
    out = {}
    for policy, plan in plans.items():
        stages = stage_functions(model, plan, targets)
        out[policy] = {}
        for side, reentrant in sides:
            time.sleep(args.settle)
            if side == "remat":
                r = worker.step(policy, seed)
                if r["plan"] and r["plan"].replace(":full", "") != compact(plan["plan"]):
                    log(f"  note: the worker ran '{r['plan']}' for {policy}; `remat plan` gave '{compact(plan['plan'])}'")
            else:
                r = pytorch_step(model, plan, stages, tokens, seed, reentrant, tracker)
            out[policy][side] = dict(r, seed=seed)
        log(f"  {policy:12s} " + "  ".join(f"{side} {out[policy][side]['seconds']:.3f} s "
                                           f"{mib(out[policy][side]['activation_peak_bytes'])} MiB "
                                           f"loss {out[policy][side]['loss']:.6f}" for side, _ in sides))
    return out


def compare_gpt(args, remat, tracker, workdir):
    """Interleaved rounds of remat and PyTorch steps; returns (plans, {policy: {side: [steps]}}, variants)."""
    plans = get_plans(remat, args)
    args.policies = list(plans)
    variants = [("pytorch", True)] + ([("pytorch_nonreentrant", False)] if args.non_reentrant else [])
    export_path = os.path.join(workdir, "export.pt")
    log(f"starting the remat worker (GPT layers {args.layers}, hidden {args.hidden}, heads {args.heads}, "
        f"sequence {args.seq}, batch {args.batch}, dropout {args.dropout})")
    worker = Worker(remat, args, export_path)
    try:
        model, tokens, targets = build_pytorch_model(args, export_path)
        results = {p: {"remat": [], **{v: [] for v, _ in variants}} for p in plans}
        for round_index in range(-1, args.rounds):
            steps = run_round(round_index, args, plans, worker, model, tokens, targets, tracker, variants)
            if round_index >= 0:
                for policy, sides in steps.items():
                    for side, step in sides.items():
                        results[policy][side].append(step)
    finally:
        worker.close()
    return plans, results, [v for v, _ in variants]


def summarize(plans, results, variants):
    rows = []
    for policy, sides in results.items():
        row = {"policy": policy, "plan": compact(plans[policy]["plan"])}
        for side, steps in sides.items():
            peaks = [s["activation_peak_bytes"] for s in steps]
            row[side] = {"median_seconds": statistics.median(s["seconds"] for s in steps),
                         "activation_peak_bytes": max(peaks), "peak_varied": len(set(peaks)) > 1, "steps": steps}
        remat = row["remat"]
        for side in variants:
            other = row[side]
            other["peak_ratio_remat_over_this"] = remat["activation_peak_bytes"] / max(other["activation_peak_bytes"], 1)
            other["time_ratio_remat_over_this"] = remat["median_seconds"] / other["median_seconds"]
            # Per round, the two steps ran back to back: their ratio cancels the machine's drift
            # between rounds, and the spread of those ratios is the comparison's resolution.
            paired = sorted(a["seconds"] / b["seconds"] for a, b in zip(remat["steps"], other["steps"]))
            quartiles = statistics.quantiles(paired, n=4, method="inclusive") if len(paired) > 1 else paired * 3
            other["time_ratio_paired_median"] = statistics.median(paired)
            other["time_ratio_paired_iqr"] = [quartiles[0], quartiles[2]]
            diffs = [abs(a["loss"] - b["loss"]) for a, b in zip(remat["steps"], other["steps"])]
            rels = [abs(a["loss"] - b["loss"]) / max(abs(b["loss"]), 1e-30) for a, b in zip(remat["steps"], other["steps"])]
            other["loss_max_abs_diff"], other["loss_max_rel_diff"] = max(diffs), max(rels)
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# Per-call overhead on a tiny function.

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


# ---------------------------------------------------------------------------------------------
# Output.

def mib(n):
    return f"{n / MIB:.1f}" if n >= 10 * MIB else f"{n / MIB:.3f}"


def gpt_table(rows, variants):
    header = ["policy", "remat peak MiB", "PyTorch peak MiB", "peak remat/PyTorch", "PyTorch - remat KiB",
              "remat step s", "PyTorch step s", "time remat/PyTorch", "per-round ratio: median (IQR)"]
    if "pytorch_nonreentrant" in variants:
        header += ["PyTorch non-reentrant step s", "time remat/non-reentrant"]
    header += ["max abs loss diff"]
    body = []
    for row in rows:
        remat, pt = row["remat"], row["pytorch"]
        cells = [row["policy"], mib(remat["activation_peak_bytes"]), mib(pt["activation_peak_bytes"]),
                 f"{pt['peak_ratio_remat_over_this']:.3f}",
                 f"{(pt['activation_peak_bytes'] - remat['activation_peak_bytes']) / 1024:.1f}",
                 f"{remat['median_seconds']:.4g}", f"{pt['median_seconds']:.4g}", f"{pt['time_ratio_remat_over_this']:.3f}",
                 f"{pt['time_ratio_paired_median']:.3f} ({pt['time_ratio_paired_iqr'][0]:.3f}-{pt['time_ratio_paired_iqr'][1]:.3f})"]
        if "pytorch_nonreentrant" in variants:
            nr = row["pytorch_nonreentrant"]
            cells += [f"{nr['median_seconds']:.4g}", f"{nr['time_ratio_remat_over_this']:.3f}"]
        cells.append(f"{max(row[v]['loss_max_abs_diff'] for v in variants):.2e}")
        body.append(cells)
    return header, body


def overhead_table(rows):
    header = ["per call, 16 floats (in*w).tanh()", "mode", "direct µs", "checkpoint µs", "overhead µs"]
    body = [[r["who"], "forward" if r["mode"] == "forward" else "forward + backward", f"{r['direct_us']:.1f}",
             f"{r['checkpoint_us']:.1f}", f"{r['overhead_us']:.1f}"] for r in rows]
    return header, body


def text_table(header, body):
    widths = [max(len(str(c)) for c in col) for col in zip(header, *body)]
    fmt = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(header), "-" * (sum(widths) + 2 * (len(widths) - 1))] + [fmt(c) for c in body])


def markdown_table(header, body):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in cells) + " |" for cells in body])


def describe(args):
    return (f"GPT layers {args.layers}, hidden {args.hidden}, heads {args.heads}, sequence {args.seq}, "
            f"batch {args.batch}, dropout {args.dropout}; {args.threads} OpenBLAS threads, 1 LibTorch intra-op "
            f"thread; median of {args.rounds} interleaved rounds after one warm-up; torch {torch.__version__}")


def write_outputs(args, plans, rows, variants, overhead, failures):
    gpt = gpt_table(rows, variants)
    print(describe(args))
    print(text_table(*gpt))
    if overhead:
        print()
        print(text_table(*overhead_table(overhead)))
    if args.markdown:
        parts = [describe(args) + "; PyTorch = torch.utils.checkpoint, use_reentrant=True.", "", markdown_table(*gpt)]
        if overhead:
            parts += ["", f"Median of {args.overhead_rounds} rounds of {args.overhead_calls} calls.", "",
                      markdown_table(*overhead_table(overhead))]
        with open(args.markdown, "w") as f:
            f.write("\n".join(parts) + "\n")
    if args.json:
        config = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "seq", "batch", "dropout", "seed",
                                                 "threads", "rounds", "policies", "loss_tolerance")}
        report = {"config": config, "torch_version": torch.__version__, "policies": rows,
                  "plans": plans, "overhead": overhead, "loss_check_failures": failures}
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")


def loss_failures(rows, variants, tolerance):
    return [f"{row['policy']} ({v}): relative loss difference {row[v]['loss_max_rel_diff']:.3e} > {tolerance:g}"
            for row in rows for v in variants if row[v]["loss_max_rel_diff"] > tolerance]


def main():
    args = parse_args()
    remat = os.path.join(args.build, "tools", "remat")
    if not os.path.exists(remat):
        fail(f"{remat} not found: build the project first: scripts/build.sh")
    tracker = Tracker(os.path.join(args.build, "libremat_memory_tracker.so"))
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="remat-side-by-side-") as workdir:
        plans, results, variants = compare_gpt(args, remat, tracker, workdir)
        overhead = None if args.no_overhead else measure_overhead(args, workdir)
    rows = summarize(plans, results, variants)
    failures = loss_failures(rows, variants, args.loss_tolerance)
    write_outputs(args, plans, rows, variants, overhead, failures)
    if failures:
        log("LOSS CHECK FAILED: remat and PyTorch computed different losses for the same weights, batch and "
            "dropout seed:\n  " + "\n  ".join(failures))
        sys.exit(1)
    log(f"loss check passed: remat and PyTorch agree within {args.loss_tolerance:g} (relative) for every step")


if __name__ == "__main__":
    main()
