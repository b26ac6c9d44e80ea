# Tokens per second under each memory budget, per strategy; render with: gnuplot throughput.gp
do for [format in "png svg"] {
  if (format eq "png") { set terminal pngcairo size 1100,760 font "DejaVu Sans,11" noenhanced; set output "throughput.png" }
  if (format eq "svg") { set terminal svg size 1100,760 font "DejaVu Sans,11" noenhanced background "white"; set output "throughput.svg" }
  set title "GPT layers 8, hidden 256, heads 8, sequence 256, vocabulary 256, dropout 0.1, global batch 16, measured"
  set xlabel "activation budget (% of the unchecked peak at the global batch)"
  set ylabel "training throughput (tokens/s)"
  set grid
  set key outside below center horizontal box
  set bmargin 7
  set yrange [0:2150.91]
  set offsets graph 0.05, graph 0.05, 0, 0
  plot "throughput.dat" using 1:($3 > 0 ? $3 : 1/0) with linespoints linewidth 2 pointtype 9 pointsize 1.6 linecolor rgb "#d62728" title "remat: micro-batch and plan chosen together", \
       "throughput.dat" using 1:($4 > 0 ? $4 : 1/0) with linespoints linewidth 2 pointtype 7 pointsize 1.6 linecolor rgb "#1f77b4" title "no checkpointing, largest micro-batch that fits", \
       "throughput.dat" using 1:($5 > 0 ? $5 : 1/0) with linespoints linewidth 2 pointtype 5 pointsize 1.6 linecolor rgb "#2ca02c" title "whole batch, optimal plan"
}
set output
