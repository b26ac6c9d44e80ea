"""Output: the text tables, the Markdown and JSON reports, and the plot."""
import json
import sys

import torch

from .common import mib
from .features import FEATURES
from .plot import plot_pareto


def pair_table(rows, non_reentrant):
    header = ["policy", "remat peak MiB", "PyTorch peak MiB", "peak remat/PyTorch", "PyTorch - remat KiB",
              "remat step s", "PyTorch step s", "time remat/PyTorch", "per-round ratio: median (IQR)"]
    if non_reentrant:
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
        if non_reentrant:
            nr = row.get("pytorch_nonreentrant")
            cells += [f"{nr['median_seconds']:.4g}", f"{nr['time_ratio_remat_over_this']:.3f}"] if nr else ["-", "-"]
        cells.append(f"{max(row[v]['loss_max_abs_diff'] for v in ('pytorch', 'pytorch_nonreentrant') if v in row):.2e}")
        body.append(cells)
    return header, body


def strategy_table(rows, args):
    header = ["strategy", "system", "activation peak MiB", "time / PyTorch eager none: median (IQR)", "loss (round 1)",
              "loss vs eager none (max rel diff)"]
    body = []
    for r in rows:
        if r["key"] == "remat-bench:none":
            continue  # a cross-check, in the JSON
        if r["first_round_loss"] is None:
            loss, versus = "-", "not reported (remat bench)"
        else:
            loss = f"{r['first_round_loss']:.6f}"
            versus = f"{r['loss_max_rel_diff_to_pytorch_none']:.1e}"
            if not r["loss_compared"]:
                versus += " (own dropout masks: not compared)"
        low, high = r["time_ratio_to_pytorch_none_paired_iqr"]
        body.append([r["strategy"], r["system"], mib(r["activation_peak_bytes"]) + ("*" if r["peak_varied"] else ""),
                     f"{r['time_ratio_to_pytorch_none_paired_median']:.3f} ({low:.3f}-{high:.3f})", loss, versus])
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


def markdown_table(header, body, text_columns=1):
    """Text columns left-aligned, the numbers after them right-aligned."""
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(["---"] * text_columns + ["---:"] * (len(header) - text_columns)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in cells) + " |" for cells in body])


def describe(args):
    return (f"GPT layers {args.layers}, hidden {args.hidden}, heads {args.heads}, sequence {args.seq}, "
            f"batch {args.batch}, dropout {args.dropout}; {args.threads} OpenBLAS threads, 1 LibTorch intra-op "
            f"thread; median of {args.rounds} interleaved rounds after one warm-up; torch {torch.__version__}")


def strategy_notes(comparison, strategy_rows):
    args = comparison.args
    notes = [
        "Activation peak: exact bytes above those held before the forward (parameters, zeroed gradients, batch), "
        "remat's tracking allocator in both processes; * = varied between rounds (the largest shown).",
        "Time: each strategy's step over PyTorch's unchecked eager step (`none`, PyTorch) in the same round; median "
        f"and IQR of the {args.rounds} per-round ratios.",
        "Loss: every strategy against PyTorch's unchecked eager loss of the same round (same weights, batch and "
        f"dropout seed); compared within {args.strategy_loss_tolerance:g} (relative)"
        + (" except where a strategy draws its own dropout masks (SDPA, compiled graphs, remat's fused option)."
           if args.dropout > 0 else "; at dropout 0 no strategy has masks to differ in."),
    ]
    if comparison.budget_plans:
        b = next(iter(comparison.budget_plans.plans.values()))
        notes.append(f"optimal B: remat's planner (`remat plan --budget B`), B a percentage of remat's predicted "
                     f"unchecked activation peak ({mib(b['unchecked_peak_bytes'])} MiB, from `remat profile`), "
                     "run reentrant" + ("; measured by `remat bench` once per round (the worker here takes policy "
                                        "names only), which reports no loss" if not comparison.worker.takes_plans else ""))
    if any(s.compile_budget is not None for s in args.pytorch_specs):
        attention = "SDPA" if args.compile_attention == "sdpa" else "the GPT's own attention ops"
        notes.append(f"compile: torch.compile (inductor, CPU, kernels for vector ISA {args.inductor_vec_isa}; "
                     f"fullgraph, static shapes) of the whole forward, with {attention}, compiled in the warm-up "
                     "round (a recompilation afterwards is an error). "
                     "compile, budget B: the same with torch._functorch.config.activation_memory_budget = B, a "
                     "fraction of the activations the default compiled partition (budget 1) saves above what "
                     "recomputing everything possible saves (0), as the partitioner estimates them: not a fraction "
                     "of any measured peak.")
    for spec in args.pytorch_specs:
        if spec.compile_budget is None:
            notes.append(f"{spec.name}: {spec.note}")
    for s in comparison.strategies.values():
        if s.key.startswith("remat:optimal"):
            notes.append(f"{s.name}: {s.note}")
    return notes


def write_outputs(comparison, pairs, strategy_rows, overhead, failures):
    args = comparison.args
    pair = pair_table(pairs, args.non_reentrant)
    strat = strategy_table(strategy_rows, args)
    notes = strategy_notes(comparison, strategy_rows)
    print(describe(args))
    print(text_table(*pair))
    print()
    print(text_table(*strat))
    for n in notes:
        print("  " + n)
    if overhead:
        print()
        print(text_table(*overhead_table(overhead)))
    if args.markdown:
        command = " ".join(["bench/pytorch_side_by_side.py"] + sys.argv[1:])
        parts = [describe(args) + ".", "", f"`{command}`", "",
                 "remat and PyTorch on the same plan (PyTorch = torch.utils.checkpoint, use_reentrant=True):", "",
                 markdown_table(*pair), "", "Every strategy:", "", markdown_table(*strat, text_columns=2), ""]
        parts += [f"- {n}" for n in notes]
        if overhead:
            parts += ["", f"Median of {args.overhead_rounds} rounds of {args.overhead_calls} calls.", "",
                      markdown_table(*overhead_table(overhead))]
        with open(args.markdown, "w") as f:
            f.write("\n".join(parts) + "\n")
    if args.json:
        config = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "seq", "batch", "dropout", "seed",
                                                 "threads", "rounds", "policies", "budgets", "non_reentrant",
                                                 "compile_attention", "inductor_vec_isa", "loss_tolerance",
                                                 "strategy_loss_tolerance")}
        config["pytorch_strategies"] = [s.token for s in args.pytorch_specs]
        capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: None)()
        report = {"config": config, "torch_version": torch.__version__, "features": FEATURES,
                  "aten_cpu_capability": capability,
                  "time_baseline": "PyTorch's unchecked eager step (policy none) of the same round",
                  "notes": notes, "policies": pairs, "strategies": strategy_rows, "plans": comparison.plans,
                  "budget_plans": comparison.budget_plans.plans if comparison.budget_plans else {},
                  "overhead": overhead, "loss_check_failures": failures}
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    if args.plot:
        plot_pareto(args, strategy_rows, args.plot)
