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
  set yrange [0.942182:1.52251]
  unset arrow
  unset label
  set arrow 1 from 206.176, graph 0 to 206.176, graph 1 nohead dashtype 2 linecolor rgb "#999999"
  set label 1 "budget 30%" at 206.176, graph 0.98 right rotate by 90 offset -0.7,0 textcolor rgb "#777777"
  set arrow 2 from 343.626, graph 0 to 343.626, graph 1 nohead dashtype 2 linecolor rgb "#999999"
  set label 2 "budget 50%" at 343.626, graph 0.98 right rotate by 90 offset -0.7,0 textcolor rgb "#777777"
  set arrow 3 from 481.076, graph 0 to 481.076, graph 1 nohead dashtype 2 linecolor rgb "#999999"
  set label 3 "budget 70%" at 481.076, graph 0.98 right rotate by 90 offset -0.7,0 textcolor rgb "#777777"
  set label 4 "none" at 692.358, 0.988358 left font ",9" front
  set label 5 "block" at 118.179, 1.45376 left font ",9" front
  set label 6 "every:2" at 194.191, 1.46459 left font ",9" front
  set label 7 "every:4" at 358.244, 1.47196 left font ",9" front
  set label 8 "segments:2" at 358.238, 1.22502 left font ",9" front
  set label 9 "segments:4" at 194.185, 1.34799 left font ",9" front
  set label 10 "sqrt" at 274.213, 1.46698 left font ",9" front
  set label 11 "ffn" at 552.288, 1.06033 left font ",9" front
  set label 12 "attn" at 263.277, 1.36679 left font ",9" front
  set label 13 "ffn+attn" at 123.201, 1.43433 left font ",9" front
  set label 14 "selective" at 349.386, 1.30367 left font ",9" front
  set label 15 "matmul-inputs" at 604.359, 0.995509 left font ",9" front
  set label 16 "block,skip-ends" at 200.2, 1.32811 left font ",9" front
  set label 17 "optimal 30%" at 208.234, 1.31219 left font ",9" front
  set label 18 "optimal 50%" at 344.283, 1.18926 left font ",9" front
  set label 19 "optimal 70%" at 480.326, 1.09945 left font ",9" front
  plot "pareto-frontier.dat" using 1:2 with steps linewidth 2 linecolor rgb "#2ca02c" title "Pareto frontier (no strategy is both smaller and faster)", \
       "pareto.dat" using 3:(strcol(2) eq "policy" ? $4 : 1/0) with points pointtype 7 pointsize 1.4 linecolor rgb "#1f77b4" title "manual policy", \
       "pareto.dat" using 3:(strcol(2) eq "planner" ? $4 : 1/0) with points pointtype 9 pointsize 2 linecolor rgb "#d62728" title "remat planner: optimal plan for the budget", \
       "pareto.dat" using 3:($5 == 1 ? $4 : 1/0) with points pointtype 6 pointsize 2.6 linecolor rgb "#2ca02c" title "circled: on the frontier"
}
set output
