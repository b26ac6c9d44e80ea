# Activation peak vs step time of every strategy; render with: gnuplot pareto.gp
do for [format in "png svg"] {
  if (format eq "png") { set terminal pngcairo size 1200,760 font "DejaVu Sans,11" noenhanced; set output "pareto.png" }
  if (format eq "svg") { set terminal svg size 1200,760 font "DejaVu Sans,11" noenhanced background "white"; set output "pareto.svg" }
  set title "remat bench: GPT 8 layers, hidden 256, 8 heads, seq 256, batch 8, dropout 0.10, fp32"
  set xlabel "activation peak (MiB): bytes held above the parameters, gradients and batch"
  set ylabel "step time: forward + backward, median (s)"
  set grid
  set key bottom left box opaque
  set xrange [0:767.482]
  set yrange [2.46776:3.84405]
  unset arrow
  unset label
  set arrow 1 from 137.45, graph 0 to 137.45, graph 1 nohead dashtype 2 linecolor rgb "#999999"
  set label 1 "budget 20%" at 137.45, graph 0.98 right rotate by 90 offset -0.7,0 textcolor rgb "#777777"
  set arrow 2 from 343.626, graph 0 to 343.626, graph 1 nohead dashtype 2 linecolor rgb "#999999"
  set label 2 "budget 50%" at 343.626, graph 0.98 right rotate by 90 offset -0.7,0 textcolor rgb "#777777"
  set arrow 3 from 137.45, graph 0 to 137.45, graph 1 nohead dashtype 2 linecolor rgb "#999999"
  set label 3 "budget 20%" at 137.45, graph 0.98 right rotate by 90 offset -0.7,0 textcolor rgb "#777777"
  set arrow 4 from 343.626, graph 0 to 343.626, graph 1 nohead dashtype 2 linecolor rgb "#999999"
  set label 4 "budget 50%" at 343.626, graph 0.98 right rotate by 90 offset -0.7,0 textcolor rgb "#777777"
  set label 5 "none" at 692.358, 2.66535 left font ",9" front
  set label 6 "block" at 118.179, 3.59752 left font ",9" front
  set label 7 "every:2" at 194.191, 3.59046 left font ",9" front
  set label 8 "optimal 20%" at 138.783, 2.76151 left font ",9" front
  set label 9 "optimal 50%" at 262.858, 2.58627 left font ",9" front
  set label 10 "block (non-reentrant)" at 118.178, 3.72418 left font ",9" front
  set label 11 "every:2 (non-reentrant)" at 194.19, 3.68325 left font ",9" front
  set label 12 "optimal 20% (non-reentrant)" at 138.783, 2.66945 left font ",9" front
  set label 13 "optimal 50% (non-reentrant)" at 262.858, 2.53731 left font ",9" front
  plot "pareto-frontier.dat" using 1:2 with steps linewidth 2 linecolor rgb "#2ca02c" title "Pareto frontier (no strategy is both smaller and faster)", \
       "pareto.dat" using 3:(strcol(2) eq "policy" ? $4 : 1/0) with points pointtype 7 pointsize 1.4 linecolor rgb "#1f77b4" title "manual policy", \
       "pareto.dat" using 3:(strcol(2) eq "planner" ? $4 : 1/0) with points pointtype 9 pointsize 2 linecolor rgb "#d62728" title "remat planner: optimal plan for the budget", \
       "pareto.dat" using 3:($5 == 1 ? $4 : 1/0) with points pointtype 6 pointsize 2.6 linecolor rgb "#2ca02c" title "circled: on the frontier"
}
set output
