# Activation peak vs step time of every strategy; render with: gnuplot pareto.gp
do for [format in "png svg"] {
  if (format eq "png") { set terminal pngcairo size 1200,760 font "DejaVu Sans,11" noenhanced; set output "pareto.png" }
  if (format eq "svg") { set terminal svg size 1200,760 font "DejaVu Sans,11" noenhanced background "white"; set output "pareto.svg" }
  set title "remat bench: GPT 8 layers, hidden 256, 8 heads, seq 256, batch 8, dropout 0.10, fp32"
  set xlabel "activation peak (MiB): bytes held above the parameters, gradients and batch"
  set ylabel "step time: forward + backward, median (s)"
  set grid
  set key top right box opaque
  set xrange [0:767.482]
  set yrange [0.833606:1.39573]
  unset arrow
  unset label
  set arrow 1 from 206.176, graph 0 to 206.176, graph 1 nohead dashtype 2 linecolor rgb "#999999"
  set label 1 "budget 30%" at 206.176, graph 0.03 left offset 0.4,0 textcolor rgb "#777777"
  set arrow 2 from 343.626, graph 0 to 343.626, graph 1 nohead dashtype 2 linecolor rgb "#999999"
  set label 2 "budget 50%" at 343.626, graph 0.03 left offset 0.4,0 textcolor rgb "#777777"
  set arrow 3 from 481.076, graph 0 to 481.076, graph 1 nohead dashtype 2 linecolor rgb "#999999"
  set label 3 "budget 70%" at 481.076, graph 0.03 left offset 0.4,0 textcolor rgb "#777777"
  plot "pareto-frontier.dat" using 1:2 with steps linewidth 2 linecolor rgb "#2ca02c" title "Pareto frontier (no strategy is both smaller and faster)", \
       "pareto.dat" using 3:(strcol(2) eq "policy" ? $4 : 1/0) with points pointtype 7 pointsize 1.4 linecolor rgb "#1f77b4" title "manual policy", \
       "pareto.dat" using 3:(strcol(2) eq "planner" ? $4 : 1/0) with points pointtype 9 pointsize 2 linecolor rgb "#d62728" title "remat planner: optimal plan for the budget", \
       "pareto.dat" using 3:($5 == 1 ? $4 : 1/0) with points pointtype 6 pointsize 2.6 linecolor rgb "#2ca02c" title "circled: on the frontier", \
       "pareto.dat" using 3:4:1 with labels left offset 1.1,0.55 font ",9" notitle
}
set output
