set terminal pngcairo size 1200,760 font "DejaVu Sans,11" noenhanced
set output "docs/results/pytorch-2x/pareto.png"
set title "GPT 8 layers, hidden 256, seq 256, batch 8, dropout 0.0: remat and PyTorch 2.6.0+debian"
set xlabel "activation peak (MiB): exact bytes above parameters, gradients and batch"
set ylabel "step time / PyTorch's unchecked eager step, same round (median)"
set grid
set key bottom right box opaque
set xrange [0:457.300204]
set yrange [0.703826:1.984728]
set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead dashtype 2 linecolor rgb "#888888"
set label 1 "none" at 400.119073, 1.090774 left font ",9" textcolor rgb "#1f77b4" front
set label 2 "none" at 400.119134, 1.014944 left font ",9" textcolor rgb "#d62728" front
set label 3 "block" at 82.196710, 1.234700 left font ",9" textcolor rgb "#1f77b4" front
set label 4 "block" at 81.938905, 1.353528 left font ",9" textcolor rgb "#d62728" front
set label 5 "block (non-reentrant)" at 70.173483, 1.364058 right font ",9" textcolor rgb "#d62728" front
set label 6 "segments:4" at 120.203851, 1.148078 left font ",9" textcolor rgb "#1f77b4" front
set label 7 "segments:4" at 119.946054, 1.187979 left font ",9" textcolor rgb "#d62728" front
set label 8 "segments:4 (non-reentrant)" at 110.180625, 1.189324 right font ",9" textcolor rgb "#d62728" front
set label 9 "selective" at 296.157648, 1.089584 left font ",9" textcolor rgb "#1f77b4" front
set label 10 "fused" at 271.634698, 0.821242 left font ",9" textcolor rgb "#1f77b4" front
set label 11 "fused+matmul-inputs" at 175.870200, 0.874583 right font ",9" textcolor rgb "#1f77b4" front
set label 12 "optimal 30% (119.5 MiB)" at 119.479974, 0.830826 left font ",9" textcolor rgb "#1f77b4" front
set label 13 "optimal 50% (199.1 MiB)" at 197.635675, 0.882307 left font ",9" textcolor rgb "#1f77b4" front
set label 14 "optimal 70% (278.8 MiB)" at 271.634698, 0.852857 left font ",9" textcolor rgb "#1f77b4" front
set label 15 "sac" at 335.943788, 1.165314 left font ",9" textcolor rgb "#d62728" front
set label 16 "sdpa" at 263.870200, 0.841815 right font ",9" textcolor rgb "#d62728" front
set label 17 "sdpa+block (non-reentrant)" at 53.251547, 1.153840 right font ",9" textcolor rgb "#d62728" front
set label 18 "sdpa+sac" at 203.454523, 0.846294 left font ",9" textcolor rgb "#d62728" front
set label 19 "compile" at 401.535089, 1.359095 left font ",9" textcolor rgb "#d62728" front
set label 20 "compile, budget 0.7" at 310.561456, 1.698919 left font ",9" textcolor rgb "#d62728" front
set label 21 "compile, budget 0.5" at 246.561456, 1.845963 left font ",9" textcolor rgb "#d62728" front
set label 22 "compile, budget 0.3" at 336.522394, 1.806898 left font ",9" textcolor rgb "#d62728" front
plot "docs/results/pytorch-2x/pareto-remat.dat" using 1:2 with points pointtype 7 pointsize 1.6 linecolor rgb "#1f77b4" title "remat", "docs/results/pytorch-2x/pareto-remat-frontier.dat" using 1:2 with lines dashtype 2 linewidth 1.2 linecolor rgb "#1f77b4" title "remat: Pareto frontier", "docs/results/pytorch-2x/pareto-pytorch.dat" using 1:2 with points pointtype 9 pointsize 1.6 linecolor rgb "#d62728" title "PyTorch", "docs/results/pytorch-2x/pareto-pytorch-frontier.dat" using 1:2 with lines dashtype 2 linewidth 1.2 linecolor rgb "#d62728" title "PyTorch: Pareto frontier"
