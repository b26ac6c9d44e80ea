// remat/measure/plan_comparison.h — does the planner's plan beat the rules of thumb? Measured, not predicted.
//
//   std::vector<remat::PlanResult> optimal = {remat::plan_optimal(costs, "30%"), remat::plan_optimal(costs, "50%")};
//   remat::MeasuredComparison c = remat::compare_measured(
//       remat::Plan::unchecked(chain), optimal, {{"block", remat::policy_plan("block", chain)}},
//       [&](const std::vector<remat::Plan>& plans) { return remat::measure_plans(chain, plans, x, 7); });
//   for (const auto& b : c.budgets) std::cout << b.overhead << " vs " << b.best_policy_overhead << "\n";
//
// Every distinct plan is measured once, in interleaved rounds (plan_measurement.h); overheads are
// paired per round against the unchecked plan, and "the fastest policy that fits" is the fastest
// whose measured peak is within the budget.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "remat/measure/plan_measurement.h"
#include "remat/planning/planner.h"

namespace remat {

struct NamedPlan {
  std::string name;
  Plan plan;
};

struct MeasuredPlan {
  std::string name;
  PlanMeasurement measured;
  double overhead = 0;  ///< paired step-time ratio to the unchecked plan, minus one
  /// The ~95% interval of `overhead` over the rounds (PairedRatio, plan_measurement.h).
  double overhead_low = 0, overhead_high = 0;
};

struct BudgetComparison {
  PlanResult optimal;     ///< the planner's result for the budget (predictions)
  MeasuredPlan measured;  ///< its plan, as measured
  bool fits = false;      ///< measured activation peak <= the budget
  /// Index into MeasuredComparison::policies of the fastest policy measured to fit; none when none fits.
  std::optional<size_t> best_policy;
  /// The optimal plan's paired step-time ratio to that policy's (1 when none fits): <= 1, no slower.
  double ratio_to_best_policy = 1;
  /// The ~95% interval of that ratio over the rounds.
  double ratio_to_best_policy_low = 1, ratio_to_best_policy_high = 1;
  /// The predicted overhead lies within the measured interval widened by the prediction's own
  /// spread (PlanResult::predicted_overhead_spread): no difference the noise does not explain.
  bool prediction_within_spread = false;
};

struct MeasuredComparison {
  MeasuredPlan unchecked;
  std::vector<MeasuredPlan> policies;
  std::vector<BudgetComparison> budgets;
};

/// Runs plans and returns one measurement each, in order (measure_plans with the model's chain and batch).
using MeasurePlans = std::function<std::vector<PlanMeasurement>(const std::vector<Plan>& plans)>;

/// Measures `unchecked`, each budget's optimal plan and every policy (a plan measured once however
/// often it appears) and compares them, budget by budget.
MeasuredComparison compare_measured(const Plan& unchecked, const std::vector<PlanResult>& optimal,
                                    const std::vector<NamedPlan>& policies, const MeasurePlans& measure);

}  // namespace remat
