// remat/budget_planner.h — "give it a memory budget, it chooses what to keep", in one call, for
// any chain (your own model through SequentialChain, or a Chain of your own).
//
//   remat::SequentialChain chain(net, [&](const at::Tensor& out) { return F::cross_entropy(out, labels); });
//   remat::PlanResult p = remat::plan_for_budget(chain, images, "50%");   // profiles, then plans
//   std::cout << p.plan.to_string() << ", predicted peak " << p.prediction.peak_bytes << " bytes\n";
//   at::Tensor loss = remat::run_plan(chain, p.plan, images);             // every training step
//
// The plan is the optimal planner's (planner.h) on the measured cost table (profiler.h), then
// verified: run for one measured step, and while its measured peak passes the budget, planned again
// for a budget lowered by the overshoot (plan_verified). A budget no plan measures within is an
// error naming the least budget that measured feasible. To keep the status instead, profile_chain
// then plan_verified (or plan_optimal, unmeasured).
#pragma once

#include <functional>

#include <torch/arg.h>

#include "remat/planner.h"

namespace remat {

struct BudgetPlanOptions {
  /// Measured profiling runs per stage and option; times are their medians.
  TORCH_ARG(int, repeats) = 3;
  /// Unmeasured profiling runs first.
  TORCH_ARG(int, warmup) = 1;
  /// Memory grid of the dynamic program: the budget is cut into this many units.
  TORCH_ARG(int64_t, memory_slots) = kDefaultMemorySlots;
  /// The checkpoint mode the plan will run in (the planner counts what each mode holds).
  TORCH_ARG(CheckpointMode, mode) = CheckpointMode::reentrant;
  /// Plans again at most this many times when the plan's measured peak passes the budget; -1: do not
  /// measure (trust the prediction).
  TORCH_ARG(int, max_replans) = 3;
  /// Offer the planner the generic option "sac" on every stage (kSelectiveOption, chain.h):
  /// profiled with the others, chosen where it pays.
  TORCH_ARG(bool, selective_option) = true;

 public:
  /// The planner's part of these options.
  PlannerOptions planner() const { return PlannerOptions().mode(mode_).memory_slots(memory_slots_); }
};

/// A plan's activation peak in bytes, measured in one training step.
using MeasurePeak = std::function<int64_t(const Plan&)>;

/// The plan for `budget` on `costs`, measured to fit: the optimal plan is measured with
/// `measure_peak`; while its peak passes the budget, the planner is asked again for the budget
/// lowered by the largest overshoot of measured over predicted seen so far (at most `max_replans`
/// times), and last the least-memory plan. The result records the measured peak and the re-plans;
/// `feasible` means measured within the budget (else least_feasible_budget_bytes is the least-memory
/// plan's measured peak, and ensure_feasible() says so).
PlanResult plan_verified(const CostTable& costs, const Budget& budget, const PlannerOptions& options,
                         const MeasurePeak& measure_peak, int max_replans = 3);

/// The activation peak of one training step of `plan` on `sample_input` (after a warm-up step),
/// the model left as it was (gradients, buffers, RNG). A chain without a loss is back-propagated
/// from a gradient of ones the size of its output, as a loss's gradient would be.
int64_t measure_plan_peak(Chain& chain, const Plan& plan, const at::Tensor& sample_input);

/// Profiles `chain` on `sample_input` (the model's input; the chain's loss, if it has one, set up
/// for it), plans for `budget` and verifies the plan on it (max_replans). Profiling and measuring
/// leave the model's gradients, buffers and the RNG streams as they were. Throws when no plan fits,
/// naming the least feasible budget.
PlanResult plan_for_budget(Chain& chain, const at::Tensor& sample_input, const Budget& budget,
                           const BudgetPlanOptions& options = {});

/// The old name of PlanResult (remat 0.x); still accepted.
using BudgetPlan = PlanResult;

}  // namespace remat
