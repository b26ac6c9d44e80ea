// How long the optimal planner takes, and the memory its table holds, on GPT chains costed by the
// analytic estimator: the reference GPT's half-block chain (18 stages, as LibTorch runs it), a
// 47-layer GPT in half blocks (96 stages, up to 3 options each) at several memory grids, and a
// 499-layer one (1,000 stages), that one also as plan_optimal plans it for a budget (1%, 10%, 50% of
// its unchecked peak). Resident memory is the process's peak so far (cases run smallest first).
//   remat_planner_bench                  all three
//   remat_planner_bench LAYERS [SLOTS]   one GPT of LAYERS layers in half blocks (SLOTS: one grid)
//   --threads N                          LibTorch's intra-op threads (default 2, the reference's)
#include <sys/resource.h>

#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include "remat/base/error.h"
#include "remat/models/estimator.h"
#include "remat/planning/planner.h"

namespace {

double resident_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
}

void time_planner(const remat::CostTable& costs, int64_t slots) {
  const auto start = std::chrono::steady_clock::now();
  const remat::OptimalPlanner planner(costs, remat::PlannerOptions().memory_slots(slots));
  const auto result = planner.plan(planner.least_feasible_budget_bytes() * 2);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const bool exact = planner.max_segment_stages() == static_cast<int64_t>(costs.stages.size());
  std::cout << "  " << slots << " memory slots (" << planner.unit_bytes() / 1024 << " KiB each): " << seconds * 1e3
            << " ms to fill the table and plan" << (result.feasible ? "" : " (infeasible)") << ", "
            << (exact ? "exact (segments of any length)"
                      : "segments of at most " + std::to_string(planner.max_segment_stages()) + " stages") +
                   ", resident peak "
            << static_cast<int64_t>(resident_mib()) << " MiB\n";
}

// What a caller of plan_optimal waits for: a table spanning [0, budget], refined least, one plan.
void time_budget(const remat::CostTable& costs, double fraction) {
  const auto start = std::chrono::steady_clock::now();
  const auto result = remat::plan_optimal(costs, remat::Budget::fraction(fraction));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "  plan_optimal at " << fraction * 100 << "% of the unchecked peak: " << seconds * 1e3 << " ms"
            << (result.feasible ? "" : " (infeasible)") << ", resident peak " << static_cast<int64_t>(resident_mib())
            << " MiB\n";
}

remat::CostTable half_block_gpt(const remat::models::GptConfig& config, remat::models::EstimateOptions options) {
  options.granularity = remat::models::GptGranularity::half;
  const auto costs = remat::models::estimate_gpt(config, options).costs;
  std::cout << "optimal planner on " << costs.stages.size() << " stages (GPT " << config.describe() << ", "
            << options.dtype << ", batch " << options.batch << ", half blocks)\n";
  return costs;
}

remat::CostTable large_gpt(int64_t layers) {
  remat::models::GptConfig config;
  config.layers(layers).hidden(1024).heads(16).sequence(1024);
  remat::models::EstimateOptions options;
  options.dtype = "bf16";
  return half_block_gpt(config, options);
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app("The optimal planner's time and memory on GPT half-block chains, costs from the analytic estimator.",
               "remat_planner_bench");
  int64_t layers = 0, slots = 0;
  int threads = 2;
  app.add_option("layers", layers,
                 "GPT layers, hidden 1024, sequence 1024, bf16 (the chain has 2 x layers + 2 stages); default: the "
                 "reference GPT, 47 and 499 layers")
      ->check(CLI::Range(int64_t{1}, int64_t{100000}));
  app.add_option("slots", slots, "one memory grid (default: 250 to 4000 slots for LAYERS, else the planner's default)")
      ->check(CLI::Range(int64_t{1}, int64_t{100000}));
  app.add_option("--threads", threads,
                 "LibTorch's intra-op threads (at::set_num_threads, as a program sets them): the table's ranges of "
                 "one length are filled on them")
      ->check(CLI::Range(1, 1024));
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(threads);
  std::cout << "on " << at::get_num_threads() << " thread" << (at::get_num_threads() == 1 ? "" : "s")
            << " (at::set_num_threads)\n";
  if (layers > 0) {
    const auto costs = large_gpt(layers);
    std::vector<int64_t> slot_counts{250, 500, 1000, 2000, 4000};
    if (slots > 0) slot_counts.assign(1, slots);
    for (const int64_t count : slot_counts) time_planner(costs, count);
    return 0;
  }
  const int64_t grid = slots > 0 ? slots : remat::kDefaultMemorySlots;
  time_planner(half_block_gpt(remat::models::GptConfig(), remat::models::EstimateOptions::as_run_by_libtorch(8)), grid);
  const auto ninety_six = large_gpt(47);
  for (const int64_t count : {int64_t{250}, grid, int64_t{4000}}) time_planner(ninety_six, count);
  const auto thousand = large_gpt(499);
  time_planner(thousand, grid);
  for (const double fraction : {0.01, 0.1, 0.5}) time_budget(thousand, fraction);
  return 0;
} catch (const c10::Error& e) {
  std::cerr << "remat_planner_bench: " << e.what_without_backtrace() << "\n";
  return 1;
}
