#include "remat/measure/plan_comparison.h"

#include <map>

#include "remat/base/error.h"

namespace remat {

MeasuredComparison compare_measured(const Plan& unchecked, const std::vector<PlanResult>& optimal,
                                    const std::vector<NamedPlan>& policies, const MeasurePlans& measure) {
  std::vector<Plan> plans;
  std::map<std::string, size_t> index;  // by granularity and compact form: each plan measured once
  auto add = [&](const Plan& plan) {
    const auto [it, added] =
        index.emplace(plan.granularity + " " + to_string(plan.mode) + " " + plan.to_string(), plans.size());
    if (added) plans.push_back(plan);
    return it->second;
  };
  const size_t unchecked_index = add(unchecked);
  std::vector<size_t> optimal_index, policy_index;
  for (const auto& r : optimal) {
    REMAT_CHECK(r.feasible, "compare_measured: the ", r.name, " planner found no plan for a budget of ", r.budget_bytes,
                " bytes; compare feasible results only.");
    optimal_index.push_back(add(r.plan));
  }
  for (const auto& p : policies) policy_index.push_back(add(p.plan));
  const std::vector<PlanMeasurement> measured = measure(plans);
  REMAT_CHECK(measured.size() == plans.size(), "compare_measured: measuring ", plans.size(), " plans returned ",
              measured.size(), " measurements.");

  const PlanMeasurement& baseline = measured[unchecked_index];
  auto as_measured = [&](const std::string& name, size_t i) {
    const PairedRatio ratio = paired_time_ratios(measured[i], baseline);
    return MeasuredPlan{name, measured[i], ratio.median - 1, ratio.low - 1, ratio.high - 1};
  };
  MeasuredComparison comparison;
  comparison.unchecked = as_measured("none", unchecked_index);
  for (size_t p = 0; p < policies.size(); ++p)
    comparison.policies.push_back(as_measured(policies[p].name, policy_index[p]));
  for (size_t b = 0; b < optimal.size(); ++b) {
    BudgetComparison c;
    c.optimal = optimal[b];
    c.measured = as_measured(optimal[b].name, optimal_index[b]);
    c.fits = c.measured.measured.activation_peak_bytes <= optimal[b].budget_bytes;
    const std::optional<size_t> best =
        fastest_fitting(measured, policy_index, optimal[b].budget_bytes, unchecked_index);
    for (size_t p = 0; best && p < policies.size(); ++p) {
      if (policy_index[p] == *best && !c.best_policy) c.best_policy = p;
    }
    if (best) {
      const PairedRatio ratio = paired_time_ratios(c.measured.measured, measured[*best]);
      c.ratio_to_best_policy = ratio.median;
      c.ratio_to_best_policy_low = ratio.low;
      c.ratio_to_best_policy_high = ratio.high;
    }
    const double predicted = c.optimal.predicted_overhead(), spread = c.optimal.predicted_overhead_spread();
    c.prediction_within_spread =
        predicted >= c.measured.overhead_low - spread && predicted <= c.measured.overhead_high + spread;
    comparison.budgets.push_back(std::move(c));
  }
  return comparison;
}

}  // namespace remat
