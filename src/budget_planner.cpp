#include "remat/budget_planner.h"

#include <algorithm>

#include <ATen/ops/ones_like.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include "detail/chain_state.h"
#include "detail/cuda_memory.h"
#include "remat/error.h"
#include "remat/memory.h"
#include "remat/profiler.h"

namespace remat {

PlanResult plan_verified(const CostTable& costs, const Budget& budget, const PlannerOptions& options,
                         const MeasurePeak& measure_peak, int max_replans) {
  REMAT_CHECK(static_cast<bool>(measure_peak), "plan_verified: give a function measuring a plan's peak.");
  REMAT_CHECK(max_replans >= 0, "plan_verified: max_replans must be 0 or more, got ", max_replans, ".");
  PlanResult result = plan_optimal(costs, budget, options);
  if (!result.feasible) return result;  // infeasible as predicted: nothing to run
  const int64_t budget_bytes = result.budget_bytes;
  // One table for every re-plan: they only ask lower budgets.
  const OptimalPlanner planner(costs, options, std::max<int64_t>(budget_bytes, 1));
  int64_t worst_error = 0;  // measured over predicted, the largest seen
  for (int round = 0;; ++round) {
    result.measured_peak_bytes = measure_peak(result.plan);
    result.replans = round;
    if (result.measured_peak_bytes <= budget_bytes) return result;
    worst_error = std::max(worst_error, result.measured_peak_bytes - result.prediction.peak_bytes);
    if (round == max_replans) break;
    PlanResult next = planner.plan(budget_bytes - worst_error);
    if (!next.feasible || next.plan.to_string() == result.plan.to_string()) break;  // nothing new to measure
    next.budget_bytes = budget_bytes;
    next.solve_seconds = result.solve_seconds;
    result = std::move(next);
  }
  // The least-memory plan: it fits, or nothing does.
  PlanResult least = result;
  least.plan = planner.least_memory_plan();
  least.prediction = simulate(least.plan, costs);
  least.measured_peak_bytes = measure_peak(least.plan);
  least.replans = result.replans + 1;
  least.feasible = least.measured_peak_bytes <= budget_bytes;
  if (least.feasible) return least;
  result.feasible = false;
  result.least_feasible_budget_bytes = least.measured_peak_bytes;
  return result;
}

int64_t measure_plan_peak(Chain& chain, const Plan& plan, const at::Tensor& sample_input) {
  plan.validate_against(chain);
  const c10::Device device = sample_input.device();
  if (device.is_cpu()) install_cpu_memory_tracker();
  const detail::ChainStateGuard untouched(chain, sample_input);
  int64_t peak = 0;
  for (int round = 0; round < 2; ++round) {  // the first allocates gradients, as a first step does
    {
      c10::NoGradGuard no_grad;
      for (const auto& p : detail::chain_parameters(chain)) {
        if (p.tensor.grad().defined()) p.tensor.mutable_grad().zero_();
      }
    }
    detail::synchronize_if_cuda(device);
    const int64_t before = memory_stats(device).current_bytes;
    reset_peak_memory(device);
    {
      at::Tensor output = run_plan(chain, plan, sample_input);
      REMAT_CHECK(output.requires_grad(), "measuring a plan: the chain's output does not require grad.");
      torch::autograd::backward({output}, {at::ones_like(output)});
    }
    detail::synchronize_if_cuda(device);
    peak = memory_stats(device).peak_bytes - before;
  }
  return peak;
}

PlanResult plan_for_budget(Chain& chain, const at::Tensor& sample_input, const Budget& budget,
                           const BudgetPlanOptions& options) {
  const CostTable costs = profile_chain(
      chain, sample_input, ProfileOptions()
                                    .repeats(options.repeats())
                                    .warmup(options.warmup())
                                    .mode(options.mode())
                                    .selective_option(options.selective_option()));
  PlanResult result =
      options.max_replans() < 0
          ? plan_optimal(costs, budget, options.planner())
          : plan_verified(costs, budget, options.planner(),
                          [&](const Plan& plan) { return measure_plan_peak(chain, plan, sample_input); },
                          options.max_replans());
  result.ensure_feasible();
  return result;
}

}  // namespace remat
