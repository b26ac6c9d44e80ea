"""The command line: arguments, their version-dependent defaults, and the run from start to end."""
import argparse
import os
import sys
import tempfile

import torch

from pytorch_gpt import check_run_args  # bench/, the entry script's directory
from .common import fail, log
from .config import DEFAULT_POLICIES, PRESETS, ROOT
from .features import FEATURES, TORCH_MAJOR
from .measurement import Comparison, Tracker, compare
from .overhead import measure_overhead
from .report import write_outputs
from .strategies import prepare_inductor_cpu, pytorch_strategy_spec
from .summary import loss_failures, summarize_pairs, summarize_strategies


def parse_args(description):
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), help="model and batch of `remat --preset`; flags override")
    for name, default in PRESETS["reference"].items():
        p.add_argument("--" + name, type=type(default), default=None, help=f"(default {default})")
    p.add_argument("--policies", default=None,
                   help="remat policies, comma-separated (default: see above, less those the model is too small for)")
    p.add_argument("--non-reentrant", action=argparse.BooleanOptionalAction, default=None,
                   help="also run PyTorch's use_reentrant=False for every policy that checkpoints (default: on 2.x)")
    p.add_argument("--pytorch-strategies", default=None,
                   help="PyTorch 2.x strategies, comma-separated: sac, sdpa, sdpa+block, sdpa+sac, compile, "
                        "compile:B (B in [0, 1]); '' for none (default: see above)")
    p.add_argument("--compile-attention", choices=("gpt", "sdpa"), default="gpt",
                   help="attention inside the compiled forward: the GPT's own ops (default) or SDPA")
    p.add_argument("--budget", default=None,
                   help="remat's planner: budgets as `remat plan --budget` takes them (e.g. 30%%,50%%,70%%; a %% is "
                        "of remat's predicted unchecked peak), comma-separated; '' for none (default: see above)")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds after one warm-up round")
    p.add_argument("--seed", type=int, default=0, help="the worker's seed (weights, batch); dropout seeds follow")
    p.add_argument("--threads", type=int, default=2, help="OpenBLAS threads, both sides (default 2)")
    p.add_argument("--no-overhead", action="store_true", help="skip the per-call overhead benchmark")
    p.add_argument("--overhead-calls", type=int, default=2000, help="calls per round of the overhead benchmark")
    p.add_argument("--overhead-rounds", type=int, default=7)
    # OpenBLAS threads spin 2^28 cycles (~0.1 s at 2.6 GHz) after their last call before sleeping:
    # pausing longer keeps one process's spinning threads out of the other's measured step.
    p.add_argument("--settle", type=float, default=0.25,
                   help="seconds to pause between steps so the other process's BLAS threads go idle (default 0.25)")
    p.add_argument("--loss-tolerance", type=float, default=1e-5,
                   help="largest relative loss difference between remat and PyTorch on the same plan")
    p.add_argument("--strategy-loss-tolerance", type=float, default=1e-4,
                   help="largest relative difference of any strategy's loss from PyTorch's unchecked eager loss")
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build directory")
    p.add_argument("--json", metavar="FILE", help="write all figures as JSON")
    p.add_argument("--markdown", metavar="FILE", help="write the tables as Markdown")
    p.add_argument("--plot", metavar="FILE", help="draw activation peak vs paired time ratio (PNG, with gnuplot)")
    args = p.parse_args()
    preset = PRESETS[args.preset or "reference"]
    for name, default in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    check_run_args(p, args)
    return p, args


def resolve_defaults(parser, args):
    """Fills the version-dependent defaults, and refuses what this torch cannot run."""
    two = TORCH_MAJOR >= 2
    args.policies_given = args.policies is not None
    if args.policies is None:
        args.policies = DEFAULT_POLICIES + (",core-attn" if two else "")
        if two and args.dropout == 0:
            args.policies += ",fused,fused+matmul-inputs"
    args.policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    if "none" not in args.policies:  # the baseline of every time ratio and loss comparison
        args.policies.insert(0, "none")
        log("note: added policy 'none': PyTorch's unchecked eager step is the baseline of the time ratios")
    if args.non_reentrant is None:
        args.non_reentrant = two
    if args.pytorch_strategies is None:
        args.pytorch_strategies = ""
        if two:
            args.pytorch_strategies = "sac" + (",sdpa,sdpa+block,sdpa+sac,compile,compile:0.7,compile:0.5,compile:0.3"
                                               if args.dropout == 0 else "")
    args.budget_given = args.budget is not None
    if args.budget is None:
        args.budget = "30%,50%,70%" if two and args.dropout == 0 else ""
    args.budgets = [b.strip() for b in args.budget.split(",") if b.strip()]
    tokens = [t.strip() for t in args.pytorch_strategies.split(",") if t.strip()]
    if len(set(tokens)) != len(tokens):
        parser.error("--pytorch-strategies lists a strategy twice")
    args.pytorch_specs = [pytorch_strategy_spec(t, args) for t in tokens]
    for spec in args.pytorch_specs:
        missing = [f for f in spec.features if not FEATURES[f]]
        if missing:
            fail(f"--pytorch-strategies {spec.token}: this torch ({torch.__version__}) lacks "
                 f"{', '.join(missing)} (torch.nn.functional.scaled_dot_product_attention, "
                 "torch.utils.checkpoint.create_selective_checkpoint_contexts, torch.compile with "
                 "torch._functorch.config.activation_memory_budget: PyTorch 2.x)")


def main(description):
    """The whole run; `description` is the --help text (the entry script's docstring)."""
    parser, args = parse_args(description)
    resolve_defaults(parser, args)
    remat = os.path.join(args.build, "tools", "remat")
    if not os.path.exists(remat):
        fail(f"{remat} not found: build the project first: scripts/build.sh")
    tracker = Tracker(os.path.join(args.build, "libremat_memory_tracker.so"))
    torch.set_num_threads(1)
    log(f"torch {torch.__version__}; features: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in FEATURES.items()))
    args.inductor_vec_isa = None
    if any(spec.compile_budget is not None for spec in args.pytorch_specs):
        args.inductor_vec_isa = prepare_inductor_cpu()
        log(f"inductor's CPU vector ISA: {args.inductor_vec_isa}")
    with tempfile.TemporaryDirectory(prefix="remat-side-by-side-") as workdir:
        comparison = Comparison(args, remat, tracker, workdir)
        try:
            compare(comparison)
        finally:
            comparison.close()
        overhead = None if args.no_overhead else measure_overhead(args, workdir)
    pairs = summarize_pairs(comparison)
    strategy_rows = summarize_strategies(comparison)
    failures = loss_failures(pairs, strategy_rows, args)
    write_outputs(comparison, pairs, strategy_rows, overhead, failures)
    if failures:
        log("LOSS CHECK FAILED: losses differ where they must not:\n  " + "\n  ".join(failures))
        sys.exit(1)
    log(f"loss check passed: remat and PyTorch agree within {args.loss_tolerance:g} (relative) for every step of "
        f"the same plan, every compared strategy within {args.strategy_loss_tolerance:g} of PyTorch's unchecked loss")
