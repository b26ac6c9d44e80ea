// remat/budget_planner.h — "give it a memory budget, it chooses what to keep", in one call, for
// any chain (your own model through SequentialChain, or a Chain of your own).
//
//   remat::SequentialChain chain(net, [&](const at::Tensor& out) { return F::cross_entropy(out, labels); });
//   remat::PlanResult p = remat::plan_for_budget(chain, images, "50%");   // profiles, then plans
//   std::cout << p.plan.to_string() << ", predicted peak " << p.prediction.peak_bytes << " bytes\n";
//   at::Tensor loss = remat::run_plan(chain, p.plan, images);             // every training step
//
// The plan is the optimal planner's (planner.h) on the measured cost table (profiler.h); a budget
// below what any plan needs is an error naming the least feasible budget. To keep the status
// instead, profile_chain then plan_optimal.
#pragma once

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

 public:
  /// The planner's part of these options.
  PlannerOptions planner() const { return PlannerOptions().mode(mode_).memory_slots(memory_slots_); }
};

/// Profiles `chain` on `sample_input` (the model's input; the chain's loss, if it has one, set up
/// for it) and plans for `budget`. Profiling leaves the model's gradients, buffers and the RNG
/// streams as they were. Throws when no plan fits, naming the least feasible budget.
PlanResult plan_for_budget(Chain& chain, const at::Tensor& sample_input, const Budget& budget,
                           const BudgetPlanOptions& options = {});

/// The old name of PlanResult (remat 0.x); still accepted.
using BudgetPlan = PlanResult;

}  // namespace remat
