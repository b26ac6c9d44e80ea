"""Summaries of the measured steps: per strategy, per policy (remat and PyTorch on the same plan),
and the loss check."""
import statistics

from .plans import compact


def quartiles(values):
    values = sorted(values)
    if len(values) == 1:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def summarize_strategies(comparison):
    """Per strategy: peak, paired time ratio to PyTorch's eager unchecked step, losses vs its loss."""
    args = comparison.args
    base = comparison.strategies["pytorch:none"].steps
    rows = []
    for s in comparison.strategies.values():
        peaks = [st["activation_peak_bytes"] for st in s.steps]
        ratios = [st["seconds"] / b["seconds"] for st, b in zip(s.steps, base)]
        low, high = quartiles(ratios)
        compared = s.steps[0]["loss"] is not None and not (s.own_masks and args.dropout > 0)
        rels = [abs(st["loss"] - b["loss"]) / max(abs(b["loss"]), 1e-30) for st, b in zip(s.steps, base)] \
            if s.steps[0]["loss"] is not None else []
        rows.append({"key": s.key, "system": s.system, "strategy": s.name, "note": s.note,
                     "activation_peak_bytes": max(peaks), "peak_varied": len(set(peaks)) > 1,
                     "median_seconds": statistics.median(st["seconds"] for st in s.steps),
                     "time_ratio_to_pytorch_none_paired_median": statistics.median(ratios),
                     "time_ratio_to_pytorch_none_paired_iqr": [low, high],
                     "first_round_loss": s.steps[0]["loss"],
                     "loss_max_rel_diff_to_pytorch_none": max(rels) if rels else None,
                     "loss_compared": compared, "own_dropout_masks": s.own_masks, "steps": s.steps})
    return rows


def summarize_pairs(comparison):
    """The policy table: remat and PyTorch on the same plan."""
    rows = []
    for policy, plan in comparison.plans.items():
        remat = comparison.strategies[f"remat:{policy}"]
        row = {"policy": policy, "plan": compact(plan["plan"]), "remat": side_summary(remat)}
        if f"pytorch:{policy}" not in comparison.strategies:
            continue  # remat-only stage options
        for side, key in (("pytorch", f"pytorch:{policy}"), ("pytorch_nonreentrant", f"pytorch-nr:{policy}")):
            other = comparison.strategies.get(key)
            if other is None:
                continue
            o = row[side] = side_summary(other)
            r = row["remat"]
            o["peak_ratio_remat_over_this"] = r["activation_peak_bytes"] / max(o["activation_peak_bytes"], 1)
            o["time_ratio_remat_over_this"] = r["median_seconds"] / o["median_seconds"]
            # Per round, the two steps ran back to back: their ratio cancels the machine's drift
            # between rounds, and the spread of those ratios is the comparison's resolution.
            paired = [a["seconds"] / b["seconds"] for a, b in zip(remat.steps, other.steps)]
            o["time_ratio_paired_median"] = statistics.median(paired)
            o["time_ratio_paired_iqr"] = list(quartiles(paired))
            diffs = [abs(a["loss"] - b["loss"]) for a, b in zip(remat.steps, other.steps)]
            rels = [abs(a["loss"] - b["loss"]) / max(abs(b["loss"]), 1e-30) for a, b in zip(remat.steps, other.steps)]
            o["loss_max_abs_diff"], o["loss_max_rel_diff"] = max(diffs), max(rels)
        rows.append(row)
    return rows


def side_summary(strategy):
    peaks = [s["activation_peak_bytes"] for s in strategy.steps]
    return {"median_seconds": statistics.median(s["seconds"] for s in strategy.steps),
            "activation_peak_bytes": max(peaks), "peak_varied": len(set(peaks)) > 1, "steps": strategy.steps}


def loss_failures(pairs, strategy_rows, args):
    failures = [f"{row['policy']} ({v}): relative loss difference {row[v]['loss_max_rel_diff']:.3e} > {args.loss_tolerance:g}"
                for row in pairs for v in ("pytorch", "pytorch_nonreentrant")
                if v in row and row[v]["loss_max_rel_diff"] > args.loss_tolerance]
    failures += [f"{r['strategy']} ({r['system']}): relative difference from PyTorch's unchecked loss "
                 f"{r['loss_max_rel_diff_to_pytorch_none']:.3e} > {args.strategy_loss_tolerance:g}"
                 for r in strategy_rows
                 if r["loss_compared"] and r["loss_max_rel_diff_to_pytorch_none"] > args.strategy_loss_tolerance]
    return failures
