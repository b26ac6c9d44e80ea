#pragma once

#include <CLI/CLI.hpp>

namespace remat::cli {

/// Registers `remat bench` (every policy and the planner at budgets, measured interleaved: table,
/// CSV, JSON, Pareto plot, memory timeline, Markdown report) and `remat trace` (the timeline alone).
void add_bench_commands(CLI::App& app);

}  // namespace remat::cli
