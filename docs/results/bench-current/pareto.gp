# Activation peak vs step time of every strategy; render with: gnuplot pareto.gp
do for [format in "png svg"] {
  if (format eq "png") { set terminal pngcairo size 1200,880 font "DejaVu Sans,11" noenhanced; set output "pareto.png" }
  if (format eq "svg") { set terminal svg size 1200,880 font "DejaVu Sans,11" noenhanced background "white"; set output "pareto.svg" }
  set title "remat bench: GPT 8 layers, hidden 256, 8 heads, seq 256, batch 8, dropout 0.10, fp32"
  set xlabel "activation peak (MiB): bytes held above the parameters, gradients and batch"
  set ylabel "step time: forward + backward, median (s)"
  set grid
  set key outside below center horizontal box
  set bmargin 7
  set tmargin 5
  set xrange [0:767.482]
  set yrange [1.02465:1.88558]
  unset arrow
  unset label
  set arrow 1 from 206.176, graph 0 to 206.176, graph 1 nohead dashtype 2 linecolor rgb "#999999"
  set label 1 "budget 30%" at 206.176, graph 1 center offset 0,0.7 textcolor rgb "#777777"
  set arrow 2 from 343.626, graph 0 to 343.626, graph 1 nohead dashtype 2 linecolor rgb "#999999"
  set label 2 "budget 50%" at 343.626, graph 1 center offset 0,0.7 textcolor rgb "#777777"
  set arrow 3 from 481.076, graph 0 to 481.076, graph 1 nohead dashtype 2 linecolor rgb "#999999"
  set label 3 "budget 70%" at 481.076, graph 1 center offset 0,0.7 textcolor rgb "#777777"
  set label 4 "none" at 692.358, 1.22343 left font ",9" front
  set label 5 "block" at 118.179, 1.78989 left font ",9" front
  set label 6 "every:2" at 194.191, 1.7715 left font ",9" front
  set label 7 "every:4" at 358.244, 1.74692 left font ",9" front
  set label 8 "segments:2" at 358.238, 1.50985 left font ",9" front
  set label 9 "segments:4" at 194.185, 1.73145 left font ",9" front
  set label 10 "sqrt" at 274.213, 1.80395 left font ",9" front
  set label 11 "ffn" at 552.288, 1.29853 left font ",9" front
  set label 12 "attn" at 263.277, 1.59599 left font ",9" front
  set label 13 "ffn+attn" at 123.201, 1.72858 left font ",9" front
  set label 14 "selective" at 335.173, 1.51066 right font ",9" front
  set label 15 "matmul-inputs" at 604.359, 1.24461 left font ",9" front
  set label 16 "fused" at 278.858, 1.18879 left font ",9" front
  set label 17 "fused+matmul-inputs" at 190.859, 1.21058 left font ",9" front
  set label 18 "block,skip-ends" at 185.987, 1.8106 right font ",9" front
  set label 19 "optimal 30%" at 206.858, 1.11175 left font ",9" front
  set label 20 "optimal 50%" at 276.858, 1.09315 left font ",9" front
  set label 21 "optimal 70%" at 276.858, 1.24708 left font ",9" front
  plot "pareto-frontier.dat" using 1:2 with steps linewidth 2 linecolor rgb "#2ca02c" title "Pareto frontier (no strategy is both smaller and faster)", \
       "pareto.dat" using 3:(strcol(2) eq "policy" ? $4 : 1/0) with points pointtype 7 pointsize 1.4 linecolor rgb "#1f77b4" title "manual policy", \
       "pareto.dat" using 3:(strcol(2) eq "planner" ? $4 : 1/0) with points pointtype 9 pointsize 2 linecolor rgb "#d62728" title "remat planner: optimal plan for the budget", \
       "pareto.dat" using 3:($5 == 1 ? $4 : 1/0) with points pointtype 6 pointsize 2.6 linecolor rgb "#2ca02c" title "circled: on the frontier"
}
set output
