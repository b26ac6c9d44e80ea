// remat/measure/plan_measurement.h — running plans for real: what they cost, and whether they are exact.
//
//   auto measured = remat::measure_plans(chain, {plain, planned}, x, 7);   // interleaved steps
//   remat::PlanVerification v = remat::verify_plan(chain, planned, x);     // against it unchecked
//   std::cout << v.to_string();   // max |Δgrad| over parameters, buffer differences
//
// Both run forward and backward of the whole chain (its last stage returning a scalar loss, or any
// tensor, back-propagated with ones) and leave the model as they found it:
// gradients, buffers and RNG streams are restored afterwards.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "remat/chain/plan.h"
#include "remat/base/threads.h"

namespace remat {

struct PlanMeasurement {
  int64_t activation_peak_bytes = 0;     ///< the largest over the measured steps
  double step_seconds = 0;               ///< median forward + backward
  std::vector<double> all_step_seconds;  ///< every measured step, in order
  /// The CPU threads the steps ran under (TimingThreads::description, threads.h).
  std::string threads;
};

/// Called before each step: round 0 is the warm-up, 1..steps are measured; `plan` indexes plans.
using MeasureProgress = std::function<void(int round, int rounds, size_t plan)>;

/// Measures forward + backward of each plan on `input`, `steps` times each after one warm-up
/// round, interleaved so that machine drift hits all alike; gradients are zeroed (kept allocated,
/// as between training steps) before each step. Where a step takes under 50 ms, each timed step
/// follows an untimed one of the same plan, as in training: a plan's first step after another's
/// pays for the caches that one left (a few percent of a step of tenth-of-a-millisecond stages).
/// `chain_for` gives the chain a plan runs on. Oversubscribed CPU threads are rearranged while it
/// measures (`threads`) and put back after (threads.h).
std::vector<PlanMeasurement> measure_plans(const std::function<Chain&(const Plan&)>& chain_for,
                                           const std::vector<Plan>& plans, const at::Tensor& input, int steps,
                                           const MeasureProgress& progress = {},
                                           ThreadsWhileTiming threads = ThreadsWhileTiming::arranged);
/// One plan on its own chain and input, for measure_runs.
struct PlanRun {
  Chain* chain = nullptr;
  Plan plan;
  at::Tensor input;
  /// Called before each step of this run (optional): e.g. to give a chain the targets of this input.
  std::function<void()> prepare;
};
/// The same, each run on its own chain and input (one model at several batch sizes, say), all
/// interleaved: comparisons across inputs get the same protection from drift as across plans. A run
/// whose input differs in shape from the run before it takes an untimed step first, so that each
/// is timed as a training loop of its shape runs it.
std::vector<PlanMeasurement> measure_runs(const std::vector<PlanRun>& runs, int steps,
                                          const MeasureProgress& progress = {},
                                          ThreadsWhileTiming threads = ThreadsWhileTiming::arranged);
/// The same, every plan on one chain.
std::vector<PlanMeasurement> measure_plans(Chain& chain, const std::vector<Plan>& plans, const at::Tensor& input,
                                           int steps, const MeasureProgress& progress = {},
                                           ThreadsWhileTiming threads = ThreadsWhileTiming::arranged);

/// Step time of `plan` relative to `baseline` (1.25: 25% slower), as the median over rounds of the
/// ratio of the two steps measured in the same round: the machine's drift between rounds cancels,
/// where a ratio of two medians carries it (on a shared machine, ten points and more).
double paired_time_ratio(const PlanMeasurement& plan, const PlanMeasurement& baseline);

/// The per-round ratios' median with its spread: a distribution-free interval of the median (about
/// 95%; with fewer than six rounds, the extremes).
struct PairedRatio {
  double median = 1, low = 1, high = 1;
  size_t rounds = 0;
  /// `ratio` lies within [low - margin, high + margin].
  bool contains(double ratio, double margin = 0) const { return ratio >= low - margin && ratio <= high + margin; }
};
PairedRatio paired_time_ratios(const PlanMeasurement& plan, const PlanMeasurement& baseline);

/// Of `candidates` (indices into `measured`), the one with the least paired time ratio to
/// `measured[baseline]` among those whose measured activation peak is at most `budget_bytes`.
std::optional<size_t> fastest_fitting(const std::vector<PlanMeasurement>& measured,
                                      const std::vector<size_t>& candidates, int64_t budget_bytes, size_t baseline);

/// How far one tensor of a planned step is from the unchecked step's.
struct TensorDifference {
  std::string name;
  double max_abs_difference = 0;  ///< +inf where one of the two is undefined (no gradient)
};

/// One step unchecked and one under a plan, from the same RNG state, buffers and zeroed gradients.
/// The unchecked step runs every stage with the plan's own option (Plan::unchecked with the plan's
/// options), so what is verified is the checkpointing: stage options that compute differently
/// by design (a fused kernel, another dropout generator) are their own stage's business, tested
/// where they are defined.
struct PlanVerification {
  double output_max_abs_difference = 0;     ///< of the chain's output (the loss)
  std::vector<TensorDifference> gradients;  ///< one per parameter, in stage order
  std::vector<TensorDifference> buffers;    ///< one per buffer the stages update, after the step
  bool identical = false;                   ///< output, gradients and buffers equal element for element
  double max_gradient_difference() const;
  double max_buffer_difference() const;
  /// Output, every gradient and every buffer equal (expected on CPU, where kernels are deterministic).
  bool bitwise_equal() const { return identical; }
  /// A few lines: the maxima, and the parameters and buffers that differ.
  std::string to_string() const;
};

PlanVerification verify_plan(Chain& chain, const Plan& plan, const at::Tensor& input);

/// The activation peak of one training step of `plan` on `sample_input` (after a warm-up step),
/// the model left as it was (gradients, buffers, RNG). A chain without a loss is back-propagated
/// from a gradient of ones the size of its output, as a loss's gradient would be.
int64_t measure_plan_peak(Chain& chain, const Plan& plan, const at::Tensor& sample_input);

}  // namespace remat
