// remat/graph/planned_step.h — any model's training step under a memory budget, its forward left
// as the user wrote it: the first step is recorded (every operator call, every tensor autograd
// saves, the backward's use of each), a plan keeps or drops each saved tensor, and every later step
// runs the same forward while the backward rebuilds each dropped tensor by replaying, op by op, the
// recorded calls that made it.
//
//   remat::PlannedStep step("50%");          // of the recorded step's peak, or Budget::bytes(...)
//   for (...) {
//     at::Tensor loss = step.run([&] { return criterion(model->forward(x), y); });
//     loss.backward();                       // or torch::autograd::grad
//     optimizer.step();
//   }
//   std::cout << step.plan().to_string();
//
// Any graph: skip connections, several inputs and outputs, tensors read many times. The forward
// must return the loss; its backward must run before the next run() for the record to be complete
// (else the next step records again). Replays run below autograd and autocast, each random call
// under the RNG state it had in the forward, each write to a tensor from outside (BatchNorm's
// running statistics) into a copy; a call that wrote a tensor of the step in place writes it again
// in the replay's own copy. Never replayed, so what they make is kept: operators outside LibTorch's
// aten namespace (custom operators, collectives), calls given a generator, and calls that read a
// tensor through an alias another call wrote since (their replay would read it unwritten). A tensor changed in place after autograd saved it is an
// error at backward, as in the unplanned program. A step whose calls differ from the record (another
// operator, shape or order) runs unplanned from the first difference, with a warning; with
// PlannedStepOptions::record_again_on_change (default) the next step is recorded and planned again.
// Peak bytes are the allocator's of PlannedStepOptions::device (CPU: remat's tracker, installed by
// the constructor; CUDA: the caching allocator's), above those held before the forward.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/arg.h>

#include "remat/planning/budget.h"

namespace remat {

/// What a plan over a recorded step keeps and drops, and what it predicts.
struct StepPlan {
  int64_t budget_bytes = 0;
  int64_t unchecked_peak_bytes = 0;  ///< measured on the recorded (unplanned) step
  int64_t predicted_peak_bytes = 0;  ///< under the plan, forward and backward
  double predicted_recompute_seconds = 0;
  double recorded_step_seconds = 0;  ///< forward and backward of the recorded step
  int64_t calls = 0;                 ///< operator calls in the forward
  int64_t saved_tensors = 0;         ///< tensors autograd saved
  int64_t storages = 0;              ///< memory blocks the step made that autograd saved
  int64_t candidates = 0;            ///< of those, the ones a replay can rebuild
  int64_t dropped = 0;               ///< dropped by the plan
  int64_t dropped_bytes = 0;
  int64_t replayed_calls = 0;  ///< calls some rebuild replays
  double plan_seconds = 0;     ///< to plan, after recording
  /// Which search found the plan: "every subset" (few candidates), "cut program" (the chain dynamic
  /// program over the execution order: segments' boundaries kept), "greedy, from keeping all", ...;
  /// empty when nothing is dropped.
  std::string search;

  /// A few lines: budget, prediction, what is dropped.
  std::string to_string() const;
};

struct PlannedStepOptions {
  /// After a step that differed from the record: record the next step and plan again (true), or
  /// keep the plan (false; each differing step runs unplanned from its first difference).
  TORCH_ARG(bool, record_again_on_change) = true;
  /// Where the step's tensors live: the allocator whose bytes the record measures.
  TORCH_ARG(c10::Device, device) = c10::kCPU;
};

class PlannedStep {
 public:
  explicit PlannedStep(Budget budget, PlannedStepOptions options = {});
  ~PlannedStep();
  PlannedStep(PlannedStep&&) noexcept;
  PlannedStep& operator=(PlannedStep&&) noexcept;

  /// Runs `forward` (which returns the loss) as this step: recorded (first), or under the plan.
  at::Tensor run(const std::function<at::Tensor()>& forward);

  /// Plans the recorded step now rather than at the next run (make_plan does, to report the plan
  /// before training). Throws unless the last run recorded the step and its backward has run, and
  /// when no plan fits the budget (naming the lowest peak found).
  const StepPlan& plan_now();

  /// Whether a plan exists (made at the run after a complete recorded step, or by plan_now).
  bool planned() const;
  /// The current plan; throws before there is one.
  const StepPlan& plan() const;
  /// Whether the last run recorded the step (ran unplanned to learn it).
  bool last_run_recorded() const;
  /// Whether the last run differed from the record (and so ran unplanned from there).
  bool last_run_differed() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace remat
