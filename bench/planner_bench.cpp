// How long the optimal planner takes: a 47-layer GPT at half-block granularity is a chain of 96
// stages (embed, 94 halves, head) with up to 3 options each; costs from the analytic estimator.
//   remat_planner_bench [LAYERS [SLOTS]]    LAYERS 47; SLOTS: one memory grid (default 250 to 4000)
#include <chrono>
#include <iostream>

#include <CLI/CLI.hpp>

#include "remat/base/error.h"
#include "remat/models/estimator.h"
#include "remat/planning/planner.h"

int main(int argc, char** argv) try {
  CLI::App app("The optimal planner's time on a GPT's half-block chain, costs from the analytic estimator.",
               "remat_planner_bench");
  int64_t layers = 47, slots = 0;
  app.add_option("layers", layers, "GPT layers (the chain has 2 x layers + 2 stages)")
      ->check(CLI::Range(int64_t{1}, int64_t{100000}));
  app.add_option("slots", slots, "one memory grid (default: 250, 500, 1000, 2000 and 4000)")
      ->check(CLI::Range(int64_t{1}, int64_t{100000000}));
  CLI11_PARSE(app, argc, argv);
  remat::models::GptConfig config;
  config.layers(layers).hidden(1024).heads(16).sequence(1024);
  remat::models::EstimateOptions options;
  options.granularity = remat::models::GptGranularity::half;
  options.dtype = "bf16";
  const auto costs = remat::models::estimate_gpt(config, options).costs;
  std::cout << "optimal planner on " << costs.stages.size() << " stages (GPT " << config.describe()
            << ", half blocks)\n";
  std::vector<int64_t> slot_counts{250, 500, 1000, 2000, 4000};
  if (slots > 0) slot_counts.assign(1, slots);
  for (const int64_t count : slot_counts) {
    const auto start = std::chrono::steady_clock::now();
    const remat::OptimalPlanner planner(costs, remat::PlannerOptions().memory_slots(count));
    const auto result = planner.plan(planner.least_feasible_budget_bytes() * 2);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << "  " << count << " memory slots (" << planner.unit_bytes() / 1024 << " KiB each): " << seconds * 1e3
              << " ms to fill the table and plan" << (result.feasible ? "" : " (infeasible)")
              << ", segments of at most " << planner.max_segment_stages() << " stages\n";
  }
  return 0;
} catch (const c10::Error& e) {
  std::cerr << "remat_planner_bench: " << e.what_without_backtrace() << "\n";
  return 1;
}
