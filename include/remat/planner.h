// remat/planner.h — choosing what to keep under a memory budget.
//
//   OptimalPlanner planner(costs, chain);            // one table answers every budget
//   PlanResult r = planner.plan(512 << 20);          // fastest plan predicted to fit 512 MiB
//   if (!r.feasible) ... r.min_feasible_budget_bytes ...
//
// The optimal planner is the dynamic program over nested segments of rotor (Beaumont et al. 2019)
// for heterogeneous chains, choosing each stage's option too; its predictions are the simulator's
// (cost_model.h), so a plan it returns replays to exactly its cost. Memory is discretised into
// `memory_slots` units of ceil(max_budget / slots) bytes: sizes round up and budgets down, so a plan
// feasible in units fits in bytes (and where rounding made the table pessimistic, rows above the
// budget's are tried while the simulator says their plans still fit). The table is bounded (a GiB,
// seconds to fill): on long chains segments are limited in length (max_segment_stages). The other
// planners are the classic rules, for comparison.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "remat/cost_model.h"

namespace remat {

struct PlanResult {
  bool feasible = false;
  Plan plan;                           ///< valid when feasible
  Prediction prediction;               ///< the simulator's, for `plan`
  int64_t budget_bytes = 0;
  int64_t min_feasible_budget_bytes = 0;  ///< predicted peak of the least-memory plan found
  double solve_seconds = 0;
};

class OptimalPlanner {
 public:
  /// `plan_template` gives the chain's granularity and stage names (Plan::plain(chain) will do).
  /// Budgets up to `max_budget_bytes` (default: twice the unchecked plan's predicted peak) are answered.
  OptimalPlanner(CostTable costs, Plan plan_template, int64_t memory_slots = 1000, int64_t max_budget_bytes = 0);

  PlanResult plan(int64_t budget_bytes) const;
  /// The table's least predicted time for a budget (+inf when infeasible), without backtracking.
  double least_seconds(int64_t budget_bytes) const;
  int64_t min_feasible_budget_bytes() const { return min_feasible_bytes_; }
  int64_t unit_bytes() const { return unit_; }
  /// The most stages a checkpointed segment spans: the chain's length unless the table for it would
  /// pass the planner's bounds (a GiB, a few seconds), then the longest that stays within them; the
  /// plan is then optimal among plans whose segments are no longer.
  int64_t max_segment_stages() const { return max_segment_; }
  double fill_seconds() const { return fill_seconds_; }

 private:
  double cost(int64_t s, int64_t t, int64_t m) const;
  void build(int64_t s, int64_t t, int64_t m, std::vector<PlanItem>& items, Plan& plan) const;
  void find_least_memory_plan();
  size_t index(int64_t s, int64_t t, int64_t m) const;
  /// Units of parameter gradients held inside a segment ending at t once stages first..t are
  /// back-propagated (0 at the top level: subproblems ending at n-1; see docs/planner.md).
  int64_t captured_units(int64_t first, int64_t t) const;

  CostTable costs_;
  Plan template_;
  int64_t n_ = 0, slots_ = 0, unit_ = 1, min_feasible_bytes_ = 0;
  double fill_seconds_ = 0;
  int64_t max_segment_ = 0;
  int64_t min_units_ = -1;  // the least memory, in units, at which the chain is feasible
  std::vector<size_t> row_offset_;  // of stage s's ranges, in table rows
  std::vector<int64_t> parameter_units_before_;  // of stages [0, k)
  std::vector<double> table_;   // least time, +inf when infeasible
  std::vector<int32_t> choice_; // < options: record with that option; >= options: segment end j
  int32_t max_options_ = 1;
};

/// Revolve (Griewank & Walther's binomial checkpointing) for homogeneous chains: the optimal plan
/// for the chain with every stage's cost replaced by the mean stage's, costed on the real chain.
PlanResult revolve_plan(const CostTable& costs, const Plan& plan_template, int64_t budget_bytes,
                        int64_t memory_slots = 1000);

/// Chen et al.'s greedy-for-budget: cut a checkpointed segment whenever the running sum of kept
/// bytes exceeds a threshold; the threshold giving the fastest plan that fits wins.
PlanResult chen_greedy_plan(const CostTable& costs, const Plan& plan_template, int64_t budget_bytes);

/// Parses a budget: "512MiB", "1.5GiB", "300000B", "800KiB", "123456" (bytes) or "50%" of
/// `unchecked_peak_bytes`. Throws a clear error for anything else.
int64_t parse_budget(const std::string& text, int64_t unchecked_peak_bytes);

}  // namespace remat
