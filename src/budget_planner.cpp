#include "remat/budget_planner.h"

#include <chrono>
#include <cmath>

#include "remat/error.h"
#include "remat/memory.h"
#include "remat/planner.h"
#include "remat/policies.h"
#include "remat/profiler.h"

namespace remat {
Budget::Budget(int bytes) : Budget(static_cast<int64_t>(bytes)) {}
Budget::Budget(int64_t bytes) : text_(std::to_string(bytes)) {
  REMAT_CHECK(bytes >= 0, "a budget in bytes must not be negative, got ", bytes, ".");
}
Budget::Budget(const char* text) : Budget(std::string(text == nullptr ? "" : text)) {}
Budget::Budget(std::string text) : text_(std::move(text)) {
  parse_budget(text_, int64_t{1} << 30);  // its form, checked now: a clear error for "12parsecs"
}

int64_t Budget::bytes(int64_t unchecked_peak_bytes) const { return parse_budget(text_, unchecked_peak_bytes); }

double BudgetPlan::predicted_overhead() const {
  return unchecked.step_seconds > 0 ? prediction.step_seconds / unchecked.step_seconds - 1 : 0.0;
}

int64_t least_feasible_budget(const CostTable& costs, const Plan& plan_template, int64_t memory_slots) {
  // The whole range first (up to twice the unchecked peak: rounding headroom), then a grid whose
  // unit is 2·least/slots, so the answer is within a fraction of a percent of the true least.
  // On a chain of many small stages, sizes rounded up to a coarse unit make the first answer far
  // too high: refine until it stops falling (a few rounds).
  const OptimalPlanner coarse(costs, plan_template, memory_slots);
  int64_t least = coarse.min_feasible_budget_bytes();
  for (int round = 0; round < 6 && least > 0; ++round) {
    const int64_t refined = OptimalPlanner(costs, plan_template, memory_slots, 2 * least).min_feasible_budget_bytes();
    if (refined <= 0 || refined >= least - least / 100) {
      if (refined > 0) least = std::min(least, refined);
      break;
    }
    least = refined;
  }
  return least;
}

BudgetPlan plan_for_budget(const CostTable& costs, const Plan& plan_template, const Budget& budget,
                           int64_t memory_slots) {
  BudgetPlan result;
  result.costs = costs;
  Plan plain = plan_template;
  plain.items.clear();
  for (int64_t i = 0; i < static_cast<int64_t>(plain.stage_names.size()); ++i) plain.items.push_back(PlanItem::run(i));
  result.unchecked = simulate(plain, costs);
  result.budget_bytes = budget.bytes(result.unchecked.peak_bytes);
  const auto start = std::chrono::steady_clock::now();
  // The table spans [0, budget]: its memory unit is budget/slots, so rounding costs at most a slot
  // per term of the recurrence, relative to the budget asked for.
  const OptimalPlanner planner(costs, plan_template, memory_slots, std::max<int64_t>(result.budget_bytes, 1));
  const PlanResult r = planner.plan(result.budget_bytes);
  result.solve_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.min_feasible_budget_bytes =
      r.feasible ? planner.min_feasible_budget_bytes() : least_feasible_budget(costs, plan_template, memory_slots);
  const int64_t least = result.min_feasible_budget_bytes;
  const double unchecked = static_cast<double>(std::max<int64_t>(result.unchecked.peak_bytes, 1));
  REMAT_CHECK(r.feasible, "no plan fits a budget of ", budget.text(), " (", result.budget_bytes, " bytes): the smallest ",
              "feasible budget is ", least, " bytes (", format_bytes(least), ", ",
              std::round(1000.0 * static_cast<double>(least) / unchecked) / 10.0,
              "% of the unchecked peak). Give at least that, or a smaller model or batch.");
  result.plan = r.plan;
  result.prediction = r.prediction;
  return result;
}

BudgetPlan plan_for_budget(Chain& chain, const at::Tensor& sample_input, const Budget& budget,
                           const BudgetPlanOptions& options) {
  const CostTable costs = profile_chain(
      chain, sample_input, ProfileOptions().repeats(options.repeats()).warmup(options.warmup()).mode(options.mode()));
  Plan plan_template = Plan::plain(chain);
  plan_template.mode = options.mode();
  return plan_for_budget(costs, plan_template, budget, options.memory_slots());
}

std::vector<std::string> with_and_without_skip_ends(const std::vector<std::string>& policies) {
  std::vector<std::string> out;
  for (const auto& policy : policies) {
    out.push_back(policy);
    out.push_back(policy + ",skip-ends");
  }
  return out;
}

std::vector<std::string> generic_policy_candidates() {
  return with_and_without_skip_ends({"block", "every:2", "every:3", "every:4", "segments:2", "segments:4", "sqrt"});
}

std::vector<PlanCandidate> compare_planners(const CostTable& costs, const Plan& plan_template, int64_t budget_bytes,
                                            const std::vector<std::string>& policies,
                                            const std::function<Plan(const std::string&)>& build,
                                            const std::function<Prediction(const Plan&)>& predict,
                                            int64_t memory_slots) {
  std::vector<PlanCandidate> out;
  for (const auto& name : policies) {
    PlanCandidate candidate;
    candidate.name = name;
    try {
      candidate.plan = build(name);
    } catch (const c10::Error&) {
      continue;  // a policy that does not apply to this chain (segments:4 of 2 blocks) is no candidate
    }
    candidate.prediction = predict(candidate.plan);
    candidate.feasible = candidate.prediction.peak_bytes <= budget_bytes;
    out.push_back(std::move(candidate));
  }
  for (const auto& [name, result] :
       {std::make_pair(std::string("revolve"), revolve_plan(costs, plan_template, budget_bytes, memory_slots)),
        std::make_pair(std::string("chen"), chen_greedy_plan(costs, plan_template, budget_bytes))}) {
    PlanCandidate candidate;
    candidate.name = name;
    candidate.feasible = result.feasible;
    candidate.plan = result.plan;
    candidate.prediction = result.prediction;
    out.push_back(std::move(candidate));
  }
  return out;
}

std::vector<PlanCandidate> compare_planners(const CostTable& costs, const Chain& chain, int64_t budget_bytes,
                                            int64_t memory_slots) {
  return compare_planners(
      costs, Plan::plain(chain), budget_bytes, generic_policy_candidates(),
      [&chain](const std::string& policy) { return policy_plan(policy, chain); },
      [&costs](const Plan& plan) { return simulate(plan, costs); }, memory_slots);
}

}  // namespace remat
