# Rows of results.md's issue-31 table from the campaign's raw outputs: python3 table.py DIR
import re, sys, os
d = sys.argv[1]
row = re.compile(r"^\s+(\d+)%\s+([\d.]+) MiB\s+([\d.]+) MiB\s+\S+\s+(\d+)\s+(\S+)\s+([+-][\d.]+)% ± ([\d.]+)\s+([+-][\d.]+)% \[([+-][\d.]+), ([+-][\d.]+)\]\s+(yes|no)\s+(yes|no)\s+[\d.]+ MiB\s+\S+\s+(\(none fits\)|\S+)\s+(\S+)\s+(-|([\d.]+) \[([\d.]+), ([\d.]+)\] (\S+))")
stats = dict(n=0, within=0, fits=0, noslower=0, cmp=0, le=0)
gaps_all = []
for model in ["convnet", "mixer", "transformer"]:
    per = {}
    for r in (1, 2, 3):
        p = os.path.join(d, f"run{r}-{model}.txt")
        if not os.path.exists(p): continue
        text = open(p).read()
        budget_mib = None
        for line in text.splitlines():
            m = row.match(line)
            if not m: continue
            b = m.group(1)
            pred, meas, lo, hi = float(m.group(6)), float(m.group(8)), m.group(9), m.group(10)
            pm, mm = float(m.group(2)), float(m.group(3))
            gap = abs(pred - meas)
            stats["n"] += 1; stats["within"] += gap <= 5.0; gaps_all.append((gap, model, b, r))
            cell = f"{m.group(6)} / {m.group(8)} [{lo}, {hi}]"
            if m.group(13) == "(none fits)": ratio = "-"
            else:
                ratio = f"{m.group(16)} [{m.group(17)}, {m.group(18)}] {m.group(19)}"
                stats["cmp"] += 1; stats["le"] += m.group(19) == "<="
                stats["noslower"] += m.group(19) in ("<=", "~")
            per.setdefault(b, []).append((cell, gap, ratio, m.group(5)))
    for b in sorted(per, key=int):
        cells = per[b]
        print(f"| {model} | {b}% | " + "; ".join(c[0] for c in cells) + " | " + ", ".join(f"{c[1]:.1f}" for c in cells)
              + " | " + "; ".join(c[2] + ("" if c[3] == "DP" else f" ({c[3]})") for c in cells) + " |")
print(stats)
print(sorted(gaps_all, reverse=True)[:5])
