#include "remat/budget_planner.h"

#include "remat/profiler.h"

namespace remat {

PlanResult plan_for_budget(Chain& chain, const at::Tensor& sample_input, const Budget& budget,
                           const BudgetPlanOptions& options) {
  const CostTable costs = profile_chain(
      chain, sample_input, ProfileOptions().repeats(options.repeats()).warmup(options.warmup()).mode(options.mode()));
  PlanResult result = plan_optimal(costs, budget, options.planner());
  result.ensure_feasible();
  return result;
}

}  // namespace remat
