set terminal pngcairo size 1200,760 font "DejaVu Sans,11" noenhanced
set output "docs/results/pytorch-2.14/pareto.png"
set title "GPT 8 layers, hidden 256, seq 256, batch 8, dropout 0.0: remat and PyTorch 2.14.1+debian"
set xlabel "activation peak (MiB): exact bytes above parameters, gradients and batch"
set ylabel "step time / PyTorch's unchecked eager step, same round (median)"
set grid
set key bottom right box opaque
set xrange [0:457.300204]
set yrange [0.795764:1.481335]
set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead dashtype 2 linecolor rgb "#888888"
set label 1 "none" at 400.119073, 0.940416 left font ",9" textcolor rgb "#1f77b4" front
set label 2 "none" at 400.119134, 1.007998 left font ",9" textcolor rgb "#d62728" front
set label 3 "block" at 82.196710, 1.295639 left font ",9" textcolor rgb "#1f77b4" front
set label 4 "block" at 81.938905, 1.407065 left font ",9" textcolor rgb "#d62728" front
set label 5 "block (non-reentrant)" at 77.938959, 1.349209 left font ",9" textcolor rgb "#d62728" front
set label 6 "segments:4" at 120.203851, 1.196615 left font ",9" textcolor rgb "#1f77b4" front
set label 7 "segments:4" at 119.946054, 1.253186 left font ",9" textcolor rgb "#d62728" front
set label 8 "segments:4 (non-reentrant)" at 117.946100, 1.281655 left font ",9" textcolor rgb "#d62728" front
set label 9 "selective" at 288.392172, 1.198727 right font ",9" textcolor rgb "#1f77b4" front
set label 10 "fused" at 271.634698, 0.875383 left font ",9" textcolor rgb "#1f77b4" front
set label 11 "fused+matmul-inputs" at 183.635675, 0.887223 left font ",9" textcolor rgb "#1f77b4" front
set label 12 "optimal 30% (119.5 MiB)" at 119.480951, 0.945576 left font ",9" textcolor rgb "#1f77b4" front
set label 13 "optimal 50% (199.1 MiB)" at 197.634698, 0.858608 left font ",9" textcolor rgb "#1f77b4" front
set label 14 "optimal 70% (278.8 MiB)" at 271.634698, 0.895741 left font ",9" textcolor rgb "#1f77b4" front
set label 15 "sac" at 335.943788, 1.337358 left font ",9" textcolor rgb "#d62728" front
set label 16 "sdpa" at 263.870200, 0.890194 right font ",9" textcolor rgb "#d62728" front
set label 17 "sdpa+block (non-reentrant)" at 61.017023, 1.116158 left font ",9" textcolor rgb "#d62728" front
set label 18 "sdpa+sac" at 203.454523, 0.948018 left font ",9" textcolor rgb "#d62728" front
set label 19 "compile" at 401.535089, 0.969136 left font ",9" textcolor rgb "#d62728" front
set label 20 "compile, budget 0.7" at 310.295831, 1.196960 left font ",9" textcolor rgb "#d62728" front
set label 21 "compile, budget 0.5" at 230.295831, 1.156784 left font ",9" textcolor rgb "#d62728" front
set label 22 "compile, budget 0.3" at 316.251886, 1.230165 left font ",9" textcolor rgb "#d62728" front
plot "docs/results/pytorch-2.14/pareto-remat.dat" using 1:2 with points pointtype 7 pointsize 1.6 linecolor rgb "#1f77b4" title "remat", "docs/results/pytorch-2.14/pareto-remat-frontier.dat" using 1:2 with lines dashtype 2 linewidth 1.2 linecolor rgb "#1f77b4" title "remat: Pareto frontier", "docs/results/pytorch-2.14/pareto-pytorch.dat" using 1:2 with points pointtype 9 pointsize 1.6 linecolor rgb "#d62728" title "PyTorch", "docs/results/pytorch-2.14/pareto-pytorch-frontier.dat" using 1:2 with lines dashtype 2 linewidth 1.2 linecolor rgb "#d62728" title "PyTorch: Pareto frontier"
