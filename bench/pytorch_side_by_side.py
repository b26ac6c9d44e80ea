#!/usr/bin/python3
"""remat and PyTorch side by side on the same GPT, the same weights and the same batch: exact
activation peaks, step times and losses, interleaved step by step.

    bench/pytorch_side_by_side.py [--preset reference | --layers 8 --hidden 256 --heads 8 --seq 256
                                   --batch 8 --dropout 0.1] [--policies none,block,...] [--rounds 3]
                                  [--[no-]non-reentrant] [--pytorch-strategies sac,sdpa,compile:0.5,...]
                                  [--budget 30%,50%,70%] [--no-overhead]
                                  [--json FILE] [--markdown FILE] [--plot FILE.png]

Needs the built project (scripts/build.sh): build/tools/remat, build/libremat_memory_tracker.so and,
for the per-call overhead, build/bench/remat_checkpoint_bench; and the python3-torch of the LibTorch
remat links (Debian 12: 1.13.1; Debian 13: 2.6, build with --build build-debian13).

Defaults: on 1.13, the policies of train/presets.json's "side_by_side_policies" and nothing else; on
2.x those plus core-attn, non-reentrant and sac, and, at dropout 0 only, fused, fused+matmul-inputs,
sdpa, sdpa+block, sdpa+sac, compile and compile:0.3/0.5/0.7 and the budgets 30%/50%/70%. Exits 1 if
a compared loss differs, 2 on a setup error. What runs, how it is measured and which losses are
compared: docs/guide-cli.md, "Side by side with PyTorch". The code: bench/side_by_side/.
"""
from side_by_side.common import reexec_under_remat_conditions  # bench/: the script's own directory

if __name__ == "__main__":
    reexec_under_remat_conditions()  # before torch is imported
    from side_by_side.cli import main
    main(__doc__)
