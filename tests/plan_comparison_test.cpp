// remat/measure/plan_comparison.h: the measured comparison of the optimal plans with the policies.
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/measure/plan_comparison.h"
#include "remat/planning/planner.h"
#include "support/compare.h"
#include "support/cost_tables.h"

using remat::CostTable;
using remat::Plan;
using remat::PlanItem;
using remat::testing::chain_with_blocks;

// The measured comparison: each plan measured once, overheads paired against the unchecked plan,
// and the fastest policy measured to fit each budget (here "measured" by the simulator, with drift).
TEST(CompareMeasured, FindsTheFastestFittingPolicyWithPairedRatiosAndMeasuresEachPlanOnce) {
  const CostTable costs = chain_with_blocks(6, 1, 4);
  const int64_t least = remat::least_feasible_budget(costs);
  const int64_t unchecked_peak = remat::simulate(costs.unchecked_plan(), costs).peak_bytes;
  const std::vector<remat::PlanResult> optimal = {
      remat::plan_optimal(costs, remat::Budget::bytes(least + (unchecked_peak - least) / 4)),
      remat::plan_optimal(costs, remat::Budget::bytes(least + 3 * (unchecked_peak - least) / 4))};
  ASSERT_TRUE(optimal[0].feasible && optimal[1].feasible);
  std::vector<remat::NamedPlan> policies;
  for (const std::string& name : {"all", "pairs"}) {
    Plan p = costs.unchecked_plan();
    if (name == "all")
      p.items = {PlanItem::run(0),
                 PlanItem::checkpointed({PlanItem::run(1), PlanItem::run(2), PlanItem::run(3), PlanItem::run(4)}),
                 PlanItem::run(5)};
    if (name == "pairs")
      p.items = {PlanItem::run(0), PlanItem::checkpointed({PlanItem::run(1), PlanItem::run(2)}),
                 PlanItem::checkpointed({PlanItem::run(3), PlanItem::run(4)}), PlanItem::run(5)};
    policies.push_back({name, p});
  }
  policies.push_back({"again", policies[0].plan});  // the same plan under another name: measured once
  size_t measured_plans = 0;
  const auto measure = [&](const std::vector<Plan>& plans) {
    measured_plans += plans.size();
    std::vector<remat::PlanMeasurement> out;
    for (const auto& plan : plans) {
      const remat::Prediction p = remat::simulate(plan, costs);
      remat::PlanMeasurement m;
      m.activation_peak_bytes = p.peak_bytes;
      for (int round = 0; round < 5; ++round)
        m.all_step_seconds.push_back(p.step_seconds * (1 + 0.2 * round));  // drift
      m.step_seconds = m.all_step_seconds[2];
      out.push_back(m);
    }
    return out;
  };
  const remat::MeasuredComparison c = remat::compare_measured(costs.unchecked_plan(), optimal, policies, measure);
  const size_t distinct_optimal = optimal[0].plan.to_string() == optimal[1].plan.to_string() ? 1 : 2;
  EXPECT_LE(measured_plans, 1 + distinct_optimal + 2) << "each distinct plan once";
  EXPECT_DOUBLE_EQ(c.unchecked.overhead, 0.0);
  ASSERT_EQ(c.policies.size(), 3u);
  const double unchecked_seconds = remat::simulate(costs.unchecked_plan(), costs).step_seconds;
  for (size_t b = 0; b < 2; ++b) {
    const auto& bc = c.budgets[b];
    EXPECT_TRUE(bc.fits);
    EXPECT_NEAR(bc.measured.overhead, optimal[b].prediction.step_seconds / unchecked_seconds - 1, 1e-12);
    // Brute force: the fastest policy whose peak fits.
    std::optional<size_t> best;
    for (size_t p = 0; p < policies.size(); ++p) {
      const remat::Prediction pp = remat::simulate(policies[p].plan, costs);
      if (pp.peak_bytes > optimal[b].budget_bytes) continue;
      if (!best || pp.step_seconds < remat::simulate(policies[*best].plan, costs).step_seconds) best = p;
    }
    EXPECT_EQ(bc.best_policy.has_value(), best.has_value()) << b;
    if (best) {
      EXPECT_EQ(c.policies[*bc.best_policy].measured.step_seconds, c.policies[*best].measured.step_seconds);
      EXPECT_LE(bc.ratio_to_best_policy, 1.0 + 1e-12) << "the optimal plan is no slower than the best policy";
    }
  }
  std::vector<remat::PlanResult> infeasible = {remat::plan_optimal(costs, remat::Budget::bytes(1))};
  REMAT_EXPECT_ERROR(remat::compare_measured(costs.unchecked_plan(), infeasible, policies, measure),
                     "compare feasible results only");
}
