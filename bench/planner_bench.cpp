// How long the optimal planner takes: a 47-layer GPT at half-block granularity is a chain of 96
// stages (embed, 94 halves, head) with up to 3 options each; costs from the analytic estimator.
// Arguments: layers (47), then one slot count (default: 250 to 4000).
#include <chrono>
#include <iostream>

#include "remat/models/estimator.h"
#include "remat/planning/planner.h"

int main(int argc, char** argv) {
  remat::models::GptConfig config;
  config.layers(argc > 1 ? std::stoi(argv[1]) : 47).hidden(1024).heads(16).sequence(1024);
  remat::models::EstimateOptions options;
  options.granularity = remat::models::GptGranularity::half;
  options.dtype = "bf16";
  const auto costs = remat::models::estimate_gpt(config, options).costs;
  std::cout << "optimal planner on " << costs.stages.size() << " stages (GPT " << config.describe()
            << ", half blocks)\n";
  std::vector<int64_t> slot_counts{250, 500, 1000, 2000, 4000};
  if (argc > 2) slot_counts.assign(1, std::stoll(argv[2]));
  for (int64_t slots : slot_counts) {
    const auto start = std::chrono::steady_clock::now();
    const remat::OptimalPlanner planner(costs, remat::PlannerOptions().memory_slots(slots));
    const auto result = planner.plan(planner.least_feasible_budget_bytes() * 2);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << "  " << slots << " memory slots (" << planner.unit_bytes() / 1024 << " KiB each): " << seconds * 1e3
              << " ms to fill the table and plan" << (result.feasible ? "" : " (infeasible)")
              << ", segments of at most " << planner.max_segment_stages() << " stages\n";
  }
  return 0;
}
