#!/usr/bin/python3
"""PyTorch's strategies on the reference GPT on one device, for scripts/gpu-check.sh: activation
peaks from the CUDA caching allocator (torch.cuda.max_memory_allocated above what is held before
the forward), step times (synchronised; the median of interleaved rounds, each strategy over the
unchecked eager step of the same round) and losses.

    bench/pytorch_gpu_reference.py [--device cuda] [--layers 8 --hidden 256 --heads 8 --seq 256
                                    --batch 8 --dropout 0.1] [--rounds 5] [--json FILE]

Strategies: none (eager, unchecked), block (torch.utils.checkpoint per block, reentrant and
non-reentrant), sac (per-block selective checkpointing keeping matmul and attention outputs), sdpa
(F.scaled_dot_product_attention, unchecked), sdpa+block (non-reentrant), sdpa+sac. The model is
bench/pytorch_gpt.py's (remat's GPT op for op), weights from --seed. Every strategy re-seeds the
generators before its forward, so the explicit-attention strategies draw the same dropout masks and
their losses must agree (exit 1 otherwise); SDPA draws its own. On a CPU (--device cpu: this
script's test) no allocator statistics exist and bytes are reported as null.
"""
import argparse
import functools
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.utils.checkpoint as torch_checkpoint  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from pytorch_gpt import GPT, check_run_args, sac_policy_ops  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--rounds", type=int, default=5, help="measured rounds after one warm-up round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loss-tolerance", type=float, default=1e-5)
    p.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    args = p.parse_args()
    check_run_args(p, args)
    return args


def block_runner(kind):
    """How each block runs: f(block, x, sdpa) -> output."""
    def plain(block, x, sdpa):
        return block.mlp_half(block.attention_half(x, sdpa))
    if kind is None:
        return plain
    options = {"use_reentrant": kind == "reentrant"}
    if kind == "sac":
        options = {"use_reentrant": False, "context_fn": functools.partial(
            torch_checkpoint.create_selective_checkpoint_contexts, sac_policy_ops())}
    return lambda block, x, sdpa: checkpoint(functools.partial(plain, block, sdpa=sdpa), x, **options)


STRATEGIES = [  # name, checkpoint kind per block, SDPA
    ("none", None, False), ("block", "reentrant", False), ("block (non-reentrant)", "non-reentrant", False),
    ("sac", "sac", False), ("sdpa", None, True), ("sdpa+block (non-reentrant)", "non-reentrant", True),
    ("sdpa+sac", "sac", True),
]


def available(kind, sdpa):
    if sdpa and not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        return False
    return kind != "sac" or hasattr(torch_checkpoint, "create_selective_checkpoint_contexts")


def step(model, tokens, targets, kind, sdpa, seed, device):
    """One forward + backward; returns (seconds, activation peak bytes or None, loss)."""
    cuda = device.type == "cuda"
    for p in model.parameters():
        p.grad.zero_()
    torch.manual_seed(seed)  # every generator, the device's too
    run = block_runner(kind)
    if cuda:
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    x = model.embed(tokens)
    for block in model.blocks:
        x = run(block, x, sdpa)
    loss = model.loss(x, targets)
    loss.backward()
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) - before if cuda else None
    return seconds, peak, loss.item()


def main():
    args = parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"pytorch_gpu_reference: torch {torch.__version__} sees no CUDA device")
    torch.manual_seed(args.seed)
    model = GPT(args.layers, args.hidden, args.heads, args.seq, args.dropout).to(device)
    model.train()
    tokens = torch.randint(0, 256, (args.batch, args.seq), device=device)
    targets = torch.randint(0, 256, (args.batch, args.seq), device=device)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    strategies = [s for s in STRATEGIES if available(s[1], s[2])]
    figures = {name: {"seconds": [], "activation_peak_bytes": [], "loss": []} for name, _, _ in strategies}
    for r in range(args.rounds + 1):  # round 0 warms up (kernels, the allocator's cache)
        order = strategies if r % 2 else list(reversed(strategies))
        for name, kind, sdpa in order:
            seconds, peak, loss = step(model, tokens, targets, kind, sdpa, args.seed + r, device)
            if r > 0:
                figures[name]["seconds"].append(seconds)
                figures[name]["activation_peak_bytes"].append(peak)
                figures[name]["loss"].append(loss)
    none = figures["none"]["seconds"]
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}: "
          f"GPT layers {args.layers}, hidden {args.hidden}, heads {args.heads}, seq {args.seq}, batch {args.batch}, "
          f"dropout {args.dropout}; median of {args.rounds} interleaved rounds")
    mismatched = []
    for name, kind, sdpa in strategies:
        f = figures[name]
        f["time_vs_none"] = statistics.median(s / n for s, n in zip(f["seconds"], none))
        peaks = [b for b in f["activation_peak_bytes"] if b is not None]
        f["max_activation_peak_bytes"] = max(peaks) if peaks else None
        shown = f"{f['max_activation_peak_bytes'] / 2**20:9.1f} MiB" if peaks else "    (no allocator statistics)"
        print(f"  {name:28s} activation peak {shown}  step {statistics.median(f['seconds']):.4f} s  "
              f"time vs none {f['time_vs_none']:.3f}  loss {f['loss'][0]:.6f}")
        if not sdpa:  # the same masks as eager: the same loss
            for a, b in zip(f["loss"], figures["none"]["loss"]):
                if abs(a - b) > args.loss_tolerance * abs(b):
                    mismatched.append(f"{name}: loss {a} vs eager {b}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"torch": torch.__version__, "device": str(device), "config": vars(args),
                       "strategies": figures}, out, indent=1)
    if mismatched:
        print("loss check FAILED: " + "; ".join(mismatched), file=sys.stderr)
        return 1
    print("loss check passed: every explicit-attention strategy matches the eager loss of its round")
    return 0


if __name__ == "__main__":
    sys.exit(main())
