"""The plot: activation peak vs paired time ratio, one point per strategy, one marker per system
(gnuplot)."""
import math
import os
import subprocess

import torch

from .common import MIB, fail


def gnuplot_string(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def place_labels(points, x_range, y_range, plot_px=(1060.0, 600.0)):
    """Per point (x, y, label): a spot for its label overlapping no point and no earlier label.

    Gnuplot places labels where told and strategies cluster, so this tries a few spots around each
    point with the label's box estimated from its length (6 px a character at 9 pt)."""
    px_x, px_y = plot_px[0] / x_range, plot_px[1] / y_range
    taken = [(x * px_x - 6, x * px_x + 6, y * px_y - 6, y * px_y + 6) for x, y, _ in points]
    candidates = [(9, 7, False), (9, -9, False), (-9, 7, True), (-9, -9, True), (9, 20, False), (-9, 20, True),
                  (9, -22, False), (-9, -22, True), (0, 32, False), (0, -34, False)]
    spots = []
    for x, y, label in points:
        cx, cy, width = x * px_x, y * px_y, 6.0 * len(label)
        chosen = None
        for dx, dy, right in candidates:
            ax, ay = cx + dx, cy + dy
            box = (ax - width if right else ax, ax if right else ax + width, ay - 6, ay + 6)
            if all(not (box[0] < t[1] and t[0] < box[1] and box[2] < t[3] and t[2] < box[3]) for t in taken):
                chosen = (box, (ax / px_x, ay / px_y, right))
                break
        if chosen is None:  # crowded everywhere: the first spot
            dx, dy, right = candidates[0]
            chosen = ((cx + dx, cx + dx + width, cy + dy - 6, cy + dy + 6), ((cx + dx) / px_x, (cy + dy) / px_y, False))
        taken.append(chosen[0])
        spots.append(chosen[1])
    return spots


def plot_pareto(args, rows, path):
    rows = [r for r in rows if r["key"] != "remat-bench:none"]
    points = [(r["activation_peak_bytes"] / MIB, r["time_ratio_to_pytorch_none_paired_median"], r["strategy"], r["system"])
              for r in rows]
    x_max = max(p[0] for p in points) * 1.15
    y_lo, y_hi = min(p[1] for p in points), max(p[1] for p in points)
    pad = 0.1 * (y_hi - y_lo + 1e-9)
    y_min, y_max = max(0.0, y_lo - pad), y_hi + 1.5 * pad
    spots = place_labels([(x, y - y_min, label) for x, y, label, _ in points], x_max, y_max - y_min)
    base = os.path.splitext(path)[0]
    systems = {"remat": ("7", "#1f77b4"), "PyTorch": ("9", "#d62728")}  # filled circle, filled triangle
    for system in systems:
        with open(f"{base}-{system.lower()}.dat", "w") as f:
            f.write("# activation_peak_MiB\ttime_ratio_to_pytorch_eager_none\tstrategy\n")
            for x, y, label, sys_ in points:
                if sys_ == system:
                    f.write(f"{x:.6f}\t{y:.6f}\t\"{label}\"\n")
    for system in systems:  # each system's Pareto frontier: no point of its own both smaller and faster
        mine = sorted((x, y) for x, y, _, sys_ in points if sys_ == system)
        with open(f"{base}-{system.lower()}-frontier.dat", "w") as f:
            best = math.inf
            for x, y in mine:
                if y < best:
                    f.write(f"{x:.6f}\t{y:.6f}\n")
                    best = y
    terminal = "pngcairo size 1200,760 font \"DejaVu Sans,11\" noenhanced"
    if "pngcairo" not in subprocess.run(["gnuplot", "-e", "set terminal"], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True).stdout:
        terminal = "png size 1200,760 noenhanced"
    title = (f"GPT {args.layers} layers, hidden {args.hidden}, seq {args.seq}, batch {args.batch}, dropout {args.dropout}: "
             f"remat and PyTorch {torch.__version__}")
    gp = [f"set terminal {terminal}", f"set output {gnuplot_string(path)}", f"set title {gnuplot_string(title)}",
          "set xlabel \"activation peak (MiB): exact bytes above parameters, gradients and batch\"",
          "set ylabel \"step time / PyTorch's unchecked eager step, same round (median)\"",
          "set grid", "set key bottom right box opaque", f"set xrange [0:{x_max:.6f}]", f"set yrange [{y_min:.6f}:{y_max:.6f}]",
          "set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead dashtype 2 linecolor rgb \"#888888\""]
    for i, ((x, y, label, system), (lx, ly, right)) in enumerate(zip(points, spots), start=1):
        color = systems[system][1]
        gp.append(f"set label {i} {gnuplot_string(label)} at {lx:.6f}, {ly + y_min:.6f} "
                  f"{'right' if right else 'left'} font \",9\" textcolor rgb \"{color}\" front")
    gp.append("plot " + ", ".join(
        f"{gnuplot_string(f'{base}-{system.lower()}.dat')} using 1:2 with points pointtype {pt} pointsize 1.6 "
        f"linecolor rgb \"{color}\" title {gnuplot_string(system)}, "
        f"{gnuplot_string(f'{base}-{system.lower()}-frontier.dat')} using 1:2 with lines dashtype 2 linewidth 1.2 "
        f"linecolor rgb \"{color}\" title {gnuplot_string(system + ': Pareto frontier')}"
        for system, (pt, color) in systems.items()))
    with open(f"{base}.gp", "w") as f:
        f.write("\n".join(gp) + "\n")
    done = subprocess.run(["gnuplot", f"{base}.gp"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        fail(f"gnuplot {base}.gp failed:\n{done.stdout.strip()}")
