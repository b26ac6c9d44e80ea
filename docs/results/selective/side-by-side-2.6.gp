set terminal pngcairo size 1200,760 font "DejaVu Sans,11" noenhanced
set output "docs/results/selective/side-by-side-2.6.png"
set title "GPT 8 layers, hidden 256, seq 256, batch 8, dropout 0.0: remat and PyTorch 2.6.0+debian"
set xlabel "activation peak (MiB): exact bytes above parameters, gradients and batch"
set ylabel "step time / PyTorch's unchecked eager step, same round (median)"
set grid
set key bottom right box opaque
set xrange [0:455.671856]
set yrange [0.695229:1.403297]
set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead dashtype 2 linecolor rgb "#888888"
set label 1 "none" at 400.105248, 0.955885 left font ",9" textcolor rgb "#1f77b4" front
set label 2 "none" at 400.105309, 1.008261 left font ",9" textcolor rgb "#d62728" front
set label 3 "block" at 82.182884, 1.258497 left font ",9" textcolor rgb "#1f77b4" front
set label 4 "block" at 81.925080, 1.326590 left font ",9" textcolor rgb "#d62728" front
set label 5 "block (non-reentrant)" at 77.925133, 1.233734 left font ",9" textcolor rgb "#d62728" front
set label 6 "selective" at 296.143822, 1.001941 left font ",9" textcolor rgb "#1f77b4" front
set label 7 "sac" at 351.929894, 1.056881 left font ",9" textcolor rgb "#1f77b4" front
set label 8 "fused" at 271.620873, 0.760136 left font ",9" textcolor rgb "#1f77b4" front
set label 9 "optimal 15% (59.7 MiB)" at 61.007042, 0.990447 left font ",9" textcolor rgb "#1f77b4" front
set label 10 "optimal 30% (119.5 MiB)" at 117.470970, 1.063085 left font ",9" textcolor rgb "#1f77b4" front
set label 11 "optimal 50% (199.1 MiB)" at 197.620873, 0.934863 left font ",9" textcolor rgb "#1f77b4" front
set label 12 "sac" at 335.929962, 1.155847 left font ",9" textcolor rgb "#d62728" front
set label 13 "sdpa+sac" at 203.440697, 0.911799 left font ",9" textcolor rgb "#d62728" front
set label 14 "sdpa+block (non-reentrant)" at 61.003197, 1.029786 left font ",9" textcolor rgb "#d62728" front
plot "docs/results/selective/side-by-side-2.6-remat.dat" using 1:2 with points pointtype 7 pointsize 1.6 linecolor rgb "#1f77b4" title "remat", "docs/results/selective/side-by-side-2.6-remat-frontier.dat" using 1:2 with lines dashtype 2 linewidth 1.2 linecolor rgb "#1f77b4" title "remat: Pareto frontier", "docs/results/selective/side-by-side-2.6-pytorch.dat" using 1:2 with points pointtype 9 pointsize 1.6 linecolor rgb "#d62728" title "PyTorch", "docs/results/selective/side-by-side-2.6-pytorch-frontier.dat" using 1:2 with lines dashtype 2 linewidth 1.2 linecolor rgb "#d62728" title "PyTorch: Pareto frontier"
