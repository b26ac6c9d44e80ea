# Activation bytes held over one training step, one panel per strategy; render with: gnuplot timeline.gp
phase_color(p) = p eq "forward" ? 0x1f77b4 : p eq "backward" ? 0xff7f0e : p eq "recompute" ? 0xd62728 : 0x999999
do for [format in "png svg"] {
  if (format eq "png") { set terminal pngcairo size 1200,740 font "DejaVu Sans,11" noenhanced; set output "timeline.png" }
  if (format eq "svg") { set terminal svg size 1200,740 font "DejaVu Sans,11" noenhanced background "white"; set output "timeline.svg" }
  set multiplot layout 3,1 title "Activation memory over one training step: GPT 8 layers, hidden 256, 8 heads, seq 256, batch 8, dropout 0.10, fp32"
  set xrange [0:1474.84]
  set yrange [0:890.828]
  set grid
  set ylabel "held (MiB)"
  set lmargin 12
  set rmargin 4
  unset label
  set label 1 "none: peak 685.3 MiB, step 1.001 s" at graph 0.01, graph 0.88 left front font ",11"
  unset xlabel
  set format x ""
  set key top right vertical box opaque samplen 2
  plot "timeline.dat" using 2:($1 == 0 ? $3 : 1/0):(phase_color(strcol(4))) with lines linewidth 1.6 linecolor rgb variable notitle, \
       NaN with lines linewidth 3 linecolor rgb "#1f77b4" title "forward", \
       NaN with lines linewidth 3 linecolor rgb "#ff7f0e" title "backward", \
       NaN with lines linewidth 3 linecolor rgb "#d62728" title "recompute (inside backward)"
  unset label
  set label 1 "block: peak 111.1 MiB, step 1.445 s" at graph 0.01, graph 0.88 left front font ",11"
  unset xlabel
  set format x ""
  unset key
  plot "timeline.dat" using 2:($1 == 1 ? $3 : 1/0):(phase_color(strcol(4))) with lines linewidth 1.6 linecolor rgb variable notitle
  unset label
  set label 1 "optimal 50%: peak 269.8 MiB, step 0.987 s" at graph 0.01, graph 0.88 left front font ",11"
  set xlabel "time since the step began (ms)"
  set format x "%g"
  unset key
  plot "timeline.dat" using 2:($1 == 2 ? $3 : 1/0):(phase_color(strcol(4))) with lines linewidth 1.6 linecolor rgb variable notitle
  unset multiplot
}
set output
