// Plots for remat's reports, rendered by gnuplot (Debian's gnuplot-nox) to PNG and SVG. Each plot
// leaves its data file and gnuplot script next to the images, so it can be restyled and rendered
// again without re-running the measurements.
#pragma once

#include <string>
#include <vector>

#include "remat/memory/memory_timeline.h"

namespace remat::cli {

struct ParetoPoint {
  std::string name;
  bool planner = false;  ///< the optimal planner's plan (else a manual policy)
  double peak_mib = 0;
  double step_seconds = 0;
  bool on_frontier = false;
};

/// A vertical line on the Pareto plot (a memory budget).
struct PlotMarker {
  std::string label;
  double mib = 0;
};

/// Marks each point that no other point beats on both activation peak and step time.
void mark_pareto_frontier(std::vector<ParetoPoint>& points);

/// One strategy's memory over a step: bytes held above what was held before the forward.
struct TimelineSeries {
  std::string name;
  std::string caption;  ///< shown in the panel, e.g. "peak 113.1 MiB, step 1.25 s"
  std::vector<MemoryEvent> events;
  int64_t base_bytes = 0;
};

/// Throughput under one budget, per strategy; 0 where a strategy has nothing that fits.
struct ThroughputPoint {
  double budget_percent = 0;  ///< of the unchecked activation peak at the global batch
  std::string budget_label;
  double chosen = 0, largest_unchecked = 0, whole_batch = 0;  ///< tokens per second
};

/// True when `gnuplot` is on the PATH.
bool gnuplot_available();

/// Writes `<dir>/pareto.dat` and `pareto.gp`, then renders pareto.png and pareto.svg; returns the
/// files written. Without gnuplot it writes the data and script and says how to render them.
std::vector<std::string> plot_pareto(const std::string& dir, const std::string& title,
                                     const std::vector<ParetoPoint>& points, const std::vector<PlotMarker>& budgets);

/// Writes `<dir>/throughput.dat` and `throughput.gp`, then renders throughput.png and .svg: tokens
/// per second against the budget, one curve per strategy.
std::vector<std::string> plot_throughput(const std::string& dir, const std::string& title,
                                         const std::vector<ThroughputPoint>& points);

/// Writes `<dir>/timeline.csv`, `timeline.dat` and `timeline.gp`, then renders timeline.png and
/// timeline.svg: one panel per strategy on a shared time axis, coloured by phase.
std::vector<std::string> plot_timeline(const std::string& dir, const std::string& title,
                                       const std::vector<TimelineSeries>& series);

}  // namespace remat::cli
