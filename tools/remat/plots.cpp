#include "plots.h"

#include "remat/memory/memory.h"

#include <algorithm>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "remat/internal/files.h"
#include "remat/internal/table.h"
#include "remat/base/error.h"

namespace remat::cli {
namespace {

// A gnuplot string literal: double quotes, with backslashes and quotes escaped.
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// A string column of a gnuplot data file: double-quoted; gnuplot's data reader has no escapes, so
// a double quote inside becomes a single one.
std::string data_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) out += c == '"' ? '\'' : c;
  return out + "\"";
}

std::string shell_quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Renders `script` (already written to dir/name.gp) unless gnuplot is missing; returns the images.
std::vector<std::string> render(const std::string& dir, const std::string& name) {
  if (!gnuplot_available()) {
    std::cerr << "warning: gnuplot is not installed (apt-get install gnuplot-nox): " << name << ".png/.svg not "
              << "rendered; run `cd " << dir << " && gnuplot " << name << ".gp` once it is.\n";
    return {};
  }
  const std::string command = "cd " + shell_quoted(dir) + " && gnuplot " + shell_quoted(name + ".gp") + " 2>&1";
  if (std::system(command.c_str()) != 0) {  // the measurements are kept: only the picture is missing
    std::cerr << "warning: gnuplot failed on " << dir << "/" << name << ".gp (its messages are above); the data "
              << "files are written, the plot is not.\n";
    return {};
  }
  return {dir + "/" + name + ".png", dir + "/" + name + ".svg"};
}

// Both terminals from one script: a loop, because a multiplot cannot be replotted.
std::string terminal_loop_begin(const std::string& name, int width, int height) {
  std::ostringstream gp;
  gp << "do for [format in \"png svg\"] {\n"
     << "  if (format eq \"png\") { set terminal pngcairo size " << width << "," << height
     << " font \"DejaVu Sans,11\" noenhanced; set output \"" << name << ".png\" }\n"
     << "  if (format eq \"svg\") { set terminal svg size " << width << "," << height
     << " font \"DejaVu Sans,11\" noenhanced background \"white\"; set output \"" << name << ".svg\" }\n";
  return gp.str();
}

// Where each point's label goes, in data coordinates: the first of a few spots around the point
// whose box (estimated from the label's length at a 9 pt font) overlaps no point and no label
// placed before it. Gnuplot has no label collision avoidance, and strategies cluster.
struct LabelSpot {
  double x, y;
  bool right_aligned;
};

std::vector<LabelSpot> place_labels(const std::vector<ParetoPoint>& points, double x_range, double y_range) {
  // The plot area of the 1200x880 canvas, between the margins, is roughly 1080x620 pixels.
  const double px_x = 1080.0 / x_range, px_y = 620.0 / y_range, char_px = 6.0, half_height = 7.0, point_px = 9.0;
  struct Box {
    double left, right, bottom, top;  // pixels
    bool overlaps(const Box& o) const { return left < o.right && o.left < right && bottom < o.top && o.bottom < top; }
  };
  std::vector<Box> taken;
  for (const auto& p : points) {
    const double cx = p.peak_mib * px_x, cy = p.step_seconds * px_y;
    taken.push_back({cx - point_px, cx + point_px, cy - point_px, cy + point_px});
  }
  const double candidates[][3] = {{10, 8, 0},  {10, -10, 0}, {-10, 8, 1},  {-10, -10, 1},
                                  {10, 22, 0}, {-10, 22, 1}, {10, -24, 0}, {-10, -24, 1}};
  std::vector<LabelSpot> spots;
  for (const auto& p : points) {
    const double cx = p.peak_mib * px_x, cy = p.step_seconds * px_y;
    const double width = char_px * static_cast<double>(p.name.size());
    Box chosen{};
    LabelSpot spot{};
    bool placed = false;
    for (const auto& c : candidates) {
      const double ax = cx + c[0], ay = cy + c[1];
      const bool right = c[2] != 0;
      const Box box{right ? ax - width : ax, right ? ax : ax + width, ay - half_height, ay + half_height};
      if (std::none_of(taken.begin(), taken.end(), [&](const Box& t) { return t.overlaps(box); })) {
        chosen = box;
        spot = {ax / px_x, ay / px_y, right};
        placed = true;
        break;
      }
    }
    if (!placed) {  // crowded everywhere: the first spot
      spot = {(cx + candidates[0][0]) / px_x, (cy + candidates[0][1]) / px_y, false};
      chosen = {cx + 10, cx + 10 + width, cy + 1, cy + 15};
    }
    taken.push_back(chosen);
    spots.push_back(spot);
  }
  return spots;
}

}  // namespace

void mark_pareto_frontier(std::vector<ParetoPoint>& points) {
  for (auto& p : points) {
    p.on_frontier = std::none_of(points.begin(), points.end(), [&](const ParetoPoint& q) {
      return q.peak_mib <= p.peak_mib && q.step_seconds <= p.step_seconds &&
             (q.peak_mib < p.peak_mib || q.step_seconds < p.step_seconds);
    });
  }
}

bool gnuplot_available() { return std::system("command -v gnuplot > /dev/null 2>&1") == 0; }

std::vector<std::string> plot_pareto(const std::string& dir, const std::string& title,
                                     const std::vector<ParetoPoint>& points, const std::vector<PlotMarker>& budgets) {
  std::ostringstream data, frontier;
  data << "# name\tkind\tactivation_peak_MiB\tstep_seconds\ton_frontier\n" << std::setprecision(8);
  for (const auto& p : points) {
    data << data_string(p.name) << '\t' << (p.planner ? "planner" : "policy") << '\t' << p.peak_mib << '\t'
         << p.step_seconds << '\t' << (p.on_frontier ? 1 : 0) << '\n';
  }
  std::vector<ParetoPoint> front;
  for (const auto& p : points) {
    if (p.on_frontier) front.push_back(p);
  }
  std::sort(front.begin(), front.end(), [](const auto& a, const auto& b) { return a.peak_mib < b.peak_mib; });
  frontier << "# the Pareto frontier, by activation peak\n" << std::setprecision(8);
  for (const auto& p : front) frontier << p.peak_mib << '\t' << p.step_seconds << '\n';
  write_file_atomically(dir + "/pareto.dat", data.str());
  write_file_atomically(dir + "/pareto-frontier.dat", frontier.str());

  double max_mib = 0, max_s = 0, min_s = 1e30;
  for (const auto& p : points) {
    max_mib = std::max(max_mib, p.peak_mib);
    max_s = std::max(max_s, p.step_seconds);
    min_s = std::min(min_s, p.step_seconds);
  }
  for (const auto& b : budgets) max_mib = std::max(max_mib, b.mib);
  const double x_max = std::max(max_mib, 1e-3) * 1.12;
  const double y_min = std::max(0.0, min_s - 0.08 * (max_s - min_s + 1e-9)),
               y_max = max_s + 0.12 * (max_s - min_s + 1e-9);
  std::ostringstream gp;
  gp << "# Activation peak vs step time of every strategy; render with: gnuplot pareto.gp\n"
     << terminal_loop_begin("pareto", 1200, 880) << "  set title " << quoted(title) << "\n"
     << "  set xlabel \"activation peak (MiB): bytes held above the parameters, gradients and batch\"\n"
     << "  set ylabel \"step time: forward + backward, median (s)\"\n"
     // The key below the plot and the budgets' labels above it, outside the data: a point in any
     // corner (a frontier point is often small and fast) is never hidden. The canvas is taller by
     // the margins they take.
     << "  set grid\n  set key outside below center horizontal box\n  set bmargin 7\n  set tmargin 5\n"
     << "  set xrange [0:" << x_max << "]\n  set yrange [" << y_min << ":" << y_max << "]\n"
     << "  unset arrow\n  unset label\n";
  int marker = 0;
  for (const auto& b : budgets) {
    gp << "  set arrow " << ++marker << " from " << b.mib << ", graph 0 to " << b.mib
       << ", graph 1 nohead dashtype 2 linecolor rgb \"#999999\"\n"
       << "  set label " << marker << " " << quoted(b.label) << " at " << b.mib << ", graph 1 center offset 0,0.7"
       << " textcolor rgb \"#777777\"\n";
  }
  const auto spots = place_labels(points, x_max, y_max - y_min);
  for (size_t i = 0; i < points.size(); ++i) {
    gp << "  set label " << ++marker << " " << quoted(points[i].name) << " at " << spots[i].x << ", " << spots[i].y
       << (spots[i].right_aligned ? " right" : " left") << " font \",9\" front\n";
  }
  gp << "  plot \"pareto-frontier.dat\" using 1:2 with steps linewidth 2 linecolor rgb \"#2ca02c\" title \"Pareto "
        "frontier (no strategy is both smaller and faster)\", \\\n"
     << "       \"pareto.dat\" using 3:(strcol(2) eq \"policy\" ? $4 : 1/0) with points pointtype 7 pointsize 1.4"
     << " linecolor rgb \"#1f77b4\" title \"manual policy\", \\\n"
     << "       \"pareto.dat\" using 3:(strcol(2) eq \"planner\" ? $4 : 1/0) with points pointtype 9 pointsize 2"
     << " linecolor rgb \"#d62728\" title \"remat planner: optimal plan for the budget\", \\\n"
     << "       \"pareto.dat\" using 3:($5 == 1 ? $4 : 1/0) with points pointtype 6 pointsize 2.6 linecolor rgb "
        "\"#2ca02c\""
     << " title \"circled: on the frontier\"\n"
     << "}\nset output\n";
  write_file_atomically(dir + "/pareto.gp", gp.str());
  auto files = render(dir, "pareto");
  files.insert(files.begin(), {dir + "/pareto.dat", dir + "/pareto-frontier.dat", dir + "/pareto.gp"});
  return files;
}

std::vector<std::string> plot_throughput(const std::string& dir, const std::string& title,
                                         const std::vector<ThroughputPoint>& points) {
  std::ostringstream data;
  data << "# budget_percent\tlabel\tchosen_tokens_per_s\tno_checkpointing_largest_batch\twhole_batch_optimal_plan"
       << " (0: nothing fits)\n"
       << std::setprecision(8);
  double y_max = 0;
  for (const auto& p : points) {
    data << p.budget_percent << '\t' << data_string(p.budget_label) << '\t' << p.chosen << '\t' << p.largest_unchecked
         << '\t' << p.whole_batch << '\n';
    y_max = std::max({y_max, p.chosen, p.largest_unchecked, p.whole_batch});
  }
  write_file_atomically(dir + "/throughput.dat", data.str());
  std::ostringstream gp;
  auto curve = [](int column, const char* color, int point, const char* name) {
    return std::string("\"throughput.dat\" using 1:($") + std::to_string(column) + " > 0 ? $" + std::to_string(column) +
           " : 1/0) with linespoints linewidth 2 pointtype " + std::to_string(point) +
           " pointsize 1.6 linecolor rgb \"" + color + "\" title \"" + name + "\"";
  };
  gp << "# Tokens per second under each memory budget, per strategy; render with: gnuplot throughput.gp\n"
     << terminal_loop_begin("throughput", 1100, 760) << "  set title " << quoted(title) << "\n"
     << "  set xlabel \"activation budget (% of the unchecked peak at the global batch)\"\n"
     << "  set ylabel \"training throughput (tokens/s)\"\n"
     << "  set grid\n  set key outside below center horizontal box\n  set bmargin 7\n"
     << "  set yrange [0:" << std::max(1.0, y_max * 1.15) << "]\n  set offsets graph 0.05, graph 0.05, 0, 0\n"
     << "  plot " << curve(3, "#d62728", 9, "remat: micro-batch and plan chosen together") << ", \\\n       "
     << curve(4, "#1f77b4", 7, "no checkpointing, largest micro-batch that fits") << ", \\\n       "
     << curve(5, "#2ca02c", 5, "whole batch, optimal plan") << "\n}\nset output\n";
  write_file_atomically(dir + "/throughput.gp", gp.str());
  auto files = render(dir, "throughput");
  files.insert(files.begin(), dir + "/throughput.dat");
  return files;
}

std::vector<std::string> plot_timeline(const std::string& dir, const std::string& title,
                                       const std::vector<TimelineSeries>& series) {
  REMAT_CHECK(!series.empty(), "plot_timeline: no strategies to plot.");
  std::ostringstream csv, data;
  csv << "strategy,milliseconds,activation_bytes,phase\n" << std::setprecision(9);
  data << "# series (0-based, in the order of the panels)\tmilliseconds\tactivation_MiB\tphase\n"
       << std::setprecision(8);
  double max_ms = 0, max_mib = 0;
  for (size_t i = 0; i < series.size(); ++i) {
    const auto& s = series[i];
    for (const auto& e : s.events) {
      const int64_t bytes = e.bytes - s.base_bytes;
      const double ms = 1e3 * e.seconds, mib = mebibytes(bytes);
      csv << csv_field(s.name) << ',' << ms << ',' << bytes << ',' << to_string(e.phase) << '\n';
      data << i << '\t' << ms << '\t' << mib << '\t' << to_string(e.phase) << '\n';
      max_ms = std::max(max_ms, ms);
      max_mib = std::max(max_mib, mib);
    }
  }
  write_file_atomically(dir + "/timeline.csv", csv.str());
  write_file_atomically(dir + "/timeline.dat", data.str());

  const int panels = static_cast<int>(series.size());
  std::ostringstream gp;
  gp << "# Activation bytes held over one training step, one panel per strategy; render with: gnuplot timeline.gp\n"
     << "phase_color(p) = p eq \"forward\" ? 0x1f77b4 : p eq \"backward\" ? 0xff7f0e : p eq \"recompute\" ? 0xd62728 : "
        "0x999999\n"
     << terminal_loop_begin("timeline", 1200, 170 + 190 * panels) << "  set multiplot layout " << panels << ",1 title "
     << quoted(title) << "\n"
     << "  set xrange [0:" << max_ms * 1.02 << "]\n  set yrange [0:" << std::max(1.0, max_mib * 1.3) << "]\n"
     << "  set grid\n  set ylabel \"held (MiB)\"\n  set lmargin 12\n  set rmargin 4\n";
  for (int i = 0; i < panels; ++i) {
    const auto& s = series[i];
    const bool first = i == 0, last = i + 1 == panels;
    gp << "  unset label\n  set label 1 " << quoted(s.name + (s.caption.empty() ? "" : ": " + s.caption))
       << " at graph 0.01, graph 0.88 left front font \",11\"\n"
       << (last ? "  set xlabel \"time since the step began (ms)\"\n  set format x \"%g\"\n"
                : "  unset xlabel\n  set format x \"\"\n")
       << (first ? "  set key top right vertical box opaque samplen 2\n" : "  unset key\n")
       << "  plot \"timeline.dat\" using 2:($1 == " << i
       << " ? $3 : 1/0):(phase_color(strcol(4))) with lines linewidth 1.6 linecolor rgb variable notitle";
    if (first) {
      gp << ", \\\n       NaN with lines linewidth 3 linecolor rgb \"#1f77b4\" title \"forward\""
         << ", \\\n       NaN with lines linewidth 3 linecolor rgb \"#ff7f0e\" title \"backward\""
         << ", \\\n       NaN with lines linewidth 3 linecolor rgb \"#d62728\" title \"recompute (inside backward)\"";
    }
    gp << "\n";
  }
  gp << "  unset multiplot\n}\nset output\n";
  write_file_atomically(dir + "/timeline.gp", gp.str());
  auto files = render(dir, "timeline");
  files.insert(files.begin(), {dir + "/timeline.csv", dir + "/timeline.dat", dir + "/timeline.gp"});
  return files;
}

}  // namespace remat::cli
