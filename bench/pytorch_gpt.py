#!/usr/bin/python3
"""The reference GPT in PyTorch (Debian's python3-torch: the same LibTorch 1.13.1 remat links),
trained one step at a time unchecked and with torch.utils.checkpoint per block, for comparing step
times and exact activation peaks with `remat train --policy block --compare` on equal terms. Bytes
come from remat's own tracking allocator, loaded into this process from build/libremat_memory_tracker.so.

    apt-get install --no-install-recommends python3-torch
    OPENBLAS_NUM_THREADS=2 bench/pytorch_gpt.py [--layers 8 --hidden 256 --heads 8 --seq 256 --batch 8]

It runs under the conditions remat's programs set for themselves: matmuls on OpenBLAS's threads and
one LibTorch intra-op thread (remat::set_cpu_threads), and freed memory kept in the process (the
script re-executes itself with the glibc tunables equivalent to remat's mallopt calls). The model
is the same architecture as models/src/gpt.cpp (weights are not copied across: this compares time
and memory, not values).
"""
import argparse
import ctypes
import math
import os
import statistics
import sys
import time

TUNABLES = "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=1073741824"
if os.environ.get("GLIBC_TUNABLES") != TUNABLES:
    os.environ["GLIBC_TUNABLES"] = TUNABLES
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.ln1, self.ln2 = nn.LayerNorm(c.hidden), nn.LayerNorm(c.hidden)
        self.qkv, self.proj = nn.Linear(c.hidden, 3 * c.hidden), nn.Linear(c.hidden, c.hidden)
        self.fc1, self.fc2 = nn.Linear(c.hidden, 4 * c.hidden), nn.Linear(4 * c.hidden, c.hidden)
        self.register_buffer("mask", torch.ones(c.seq, c.seq, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, x):  # x: (B, T, C)
        b, t, ch = x.shape
        hs = ch // self.c.heads
        q, k, v = self.qkv(self.ln1(x)).split(ch, 2)
        q, k, v = (u.view(b, t, self.c.heads, hs).transpose(1, 2) for u in (q, k, v))  # (B, NH, T, HS)
        scores = q.matmul(k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        probs = F.dropout(scores.masked_fill(self.mask[:t, :t], float("-inf")).softmax(-1), self.c.dropout, self.training)
        x = x + F.dropout(self.proj(probs.matmul(v).transpose(1, 2).contiguous().view(b, t, ch)), self.c.dropout, self.training)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), self.c.dropout, self.training)


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.wte, self.wpe = nn.Embedding(256, c.hidden), nn.Embedding(c.seq, c.hidden)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln_f, self.head = nn.LayerNorm(c.hidden), nn.Linear(c.hidden, 256, bias=False)

    def forward(self, tokens, targets, policy):
        x = F.dropout(self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1])), self.c.dropout, self.training)
        for block in self.blocks:
            x = block(x) if policy == "none" else checkpoint(block, x, use_reentrant=(policy == "block-reentrant"))
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, 256), targets.view(-1))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in [("layers", 8), ("hidden", 256), ("heads", 8), ("seq", 256), ("batch", 8), ("steps", 5)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--tracker", default=os.path.join(os.path.dirname(__file__), "..", "build", "libremat_memory_tracker.so"))
    c = p.parse_args()
    tracker = ctypes.CDLL(c.tracker)
    tracker.remat_cpu_current_bytes.restype = ctypes.c_int64
    tracker.remat_cpu_peak_bytes.restype = ctypes.c_int64
    tracker.remat_install_cpu_memory_tracker()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT(c)
    tokens = torch.randint(0, 256, (c.batch, c.seq))
    targets = torch.randint(0, 256, (c.batch, c.seq))
    policies = ["none", "block-reentrant", "block-nonreentrant"]
    seconds = {k: [] for k in policies}
    peaks = {k: 0 for k in policies}
    for step in range(-1, c.steps):  # one warm-up round (allocates gradients), then interleaved steps
        for policy in policies:
            model.zero_grad(set_to_none=False)
            before = tracker.remat_cpu_current_bytes()
            tracker.remat_cpu_reset_peak()
            start = time.perf_counter()
            model(tokens, targets, policy).backward()
            if step >= 0:
                seconds[policy].append(time.perf_counter() - start)
                peaks[policy] = max(peaks[policy], tracker.remat_cpu_peak_bytes() - before)
    none = statistics.median(seconds["none"])
    for policy in policies:
        s = statistics.median(seconds[policy])
        print(f"{policy:20s} activation peak {peaks[policy] / 2**20:7.1f} MiB  step {s:.3f} s (median of {c.steps})"
              f"  vs none {s / none:.2f}x")


if __name__ == "__main__":
    main()
