// remat/planning/budget_planner.h — "give it a memory budget, it chooses what to keep", in one call, for
// any chain (your own model through SequentialChain, or a Chain of your own).
//
//   remat::SequentialChain chain(net, [&](const at::Tensor& out) { return F::cross_entropy(out, labels); });
//   remat::PlanResult p = remat::plan_for_budget(chain, images, "50%");   // profiles, then plans
//   std::cout << p.plan.to_string() << ", predicted peak " << p.prediction.peak_bytes << " bytes\n";
//   at::Tensor loss = remat::run_plan(chain, p.plan, images);             // every training step
//
// A share ("50%") is of the unchecked step's activation peak as measured (one step is run for it;
// PlanResult::measured_unchecked_peak_bytes), not of the prediction, so a user's own measurement of
// the unchecked step gives the same bytes; the plan is chosen at that share of the predicted peak.
// The plan is the optimal planner's (planner.h) on the measured cost table (profiler.h), then
// verified: run for one measured step, and while its measured peak passes the budget, planned again
// for a budget lowered by the overshoot (plan_verified); then, where the cost model cannot tell it
// from a rule of thumb that fits (their predictions within the noise), timed against those in a
// short interleaved series, the fastest kept (choose_by_measurement). A budget no plan measures within is an
// error naming the least budget that measured feasible. To keep the status instead, profile_chain
// then plan_verified (or plan_optimal, unmeasured).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <torch/arg.h>

#include "remat/planning/planner.h"
#include "remat/planning/profiler.h"
#include "remat/base/threads.h"

namespace remat {

/// When the planned plan is timed against the rules of thumb nearest it (choose_by_measurement).
enum class ChooseByMeasurement {
  automatic,  ///< where the series is predicted to take at most MeasuredChoiceOptions::max_seconds
  always,
  never,
};

struct MeasuredChoiceOptions {
  TORCH_ARG(ChooseByMeasurement, when) = ChooseByMeasurement::automatic;
  /// The most rules of thumb timed against the plan: the fastest predicted of those predicted to
  /// fit and to lie within the noise of the plan (its and their spreads, or `margin`).
  TORCH_ARG(int, candidates) = 3;
  /// Interleaved measured steps per plan, in one series.
  TORCH_ARG(int, steps) = 11;
  /// Where a candidate measured faster by its median but its interval still reaches 1, another
  /// series is run and added to the first, up to this many in all (automatic: as far as
  /// max_seconds allows).
  TORCH_ARG(int, max_series) = 3;
  /// `automatic`: measure only where (1 + candidates) x (steps + 1) predicted steps take at most this.
  TORCH_ARG(double, max_seconds) = 10.0;
  /// A rule of thumb predicted slower than the plan by more than this share of the unchecked step,
  /// and by more than the predictions' spreads, is not timed: the cost model separates them.
  TORCH_ARG(double, margin) = 0.03;
};

/// How often a plan is planned again when its measured peak passes the budget (plan_verified).
constexpr int kDefaultMaxReplans = 3;

/// The profile that plans for a budget: as ProfileOptions, and with the generic option "sac"
/// (kSelectiveOption, chain.h) measured on every stage, so the planner can choose it where it pays.
inline ProfileOptions budget_profile_options() { return ProfileOptions().selective_option(true); }

struct BudgetPlanOptions {
  /// The checkpoint mode the plan will run in and the dynamic program's memory grid.
  TORCH_ARG(PlannerOptions, planner) = {};
  /// How the chain is profiled (repeats, warm-up, threads); run in the planner's mode. A profile
  /// given whole replaces budget_profile_options(): start from it to keep the "sac" option.
  TORCH_ARG(ProfileOptions, profile) = budget_profile_options();
  /// Plans again at most this many times when the plan's measured peak passes the budget; -1: do not
  /// measure (trust the prediction).
  TORCH_ARG(int, max_replans) = kDefaultMaxReplans;
  /// The verified plan timed against the nearest rules of thumb, the fastest kept.
  TORCH_ARG(MeasuredChoiceOptions, choice) = {};

 public:
  /// The mode plans run in, for the planner and the profile at once: a plan is profiled in the
  /// mode it runs in.
  BudgetPlanOptions& mode(CheckpointMode mode) {
    planner_.mode(mode);
    profile_.mode(mode);
    return *this;
  }
};

/// A plan's activation peak in bytes, measured in one training step.
using MeasurePeak = std::function<int64_t(const Plan&)>;

/// The plan for `budget` on `costs`, measured to fit: the optimal plan is measured with
/// `measure_peak`; while its peak passes the budget, the planner is asked again for the budget
/// lowered by the largest overshoot of measured over predicted seen so far (at most `max_replans`
/// times), and last the least-memory plan. The result records the measured peak and the re-plans;
/// `feasible` means measured within the budget (else least_feasible_budget_bytes is the least-memory
/// plan's measured peak, and ensure_feasible() says so).
/// `measured_budget_bytes` (> 0), where given, is what the measured peak must fit instead of the
/// planned budget: a share of the measured unchecked peak, the plan chosen at the same share of the
/// predicted one (plan_for_budget); the least-memory plan is then measured even where no plan was
/// predicted to fit.
PlanResult plan_verified(const CostTable& costs, const Budget& budget, const PlannerOptions& options,
                         const MeasurePeak& measure_peak, int max_replans = kDefaultMaxReplans,
                         int64_t measured_budget_bytes = -1);

/// plan_verified on `chain` itself, as plan_for_budget verifies once it has profiled: each plan
/// measured by measure_plan_peak on `sample_input`, and a share ("50%") taken of the unchecked
/// step's measured peak: `unchecked_peak_bytes` where the caller has measured it (to plan several
/// budgets on one measurement), else one unchecked step is run. The result records it
/// (measured_unchecked_peak_bytes; -1 for an absolute budget, which needs none).
PlanResult plan_verified(Chain& chain, const CostTable& costs, const at::Tensor& sample_input, const Budget& budget,
                         const PlannerOptions& options = {}, int max_replans = kDefaultMaxReplans,
                         int64_t unchecked_peak_bytes = -1);

/// The activation peak of one training step of `plan` on `sample_input` (after a warm-up step),
/// the model left as it was (gradients, buffers, RNG). A chain without a loss is back-propagated
/// from a gradient of ones the size of its output, as a loss's gradient would be.
int64_t measure_plan_peak(Chain& chain, const Plan& plan, const at::Tensor& sample_input);

/// A candidate plan beside the planned one.
struct CandidatePlan {
  std::string name;
  Plan plan;
};

/// Times `planned` (a feasible result on `costs`) against `candidates` in `steps` interleaved steps
/// on `sample_input`, and keeps the fastest whose measured peak fits the budget and whose paired step
/// ratio to `planned` lies below 1 with its whole ~95% interval (else `planned`); up to `max_series`
/// series of `steps` while a candidate is faster by its median but not beyond the spread. The
/// result's plan, prediction and measured peak are the kept one's, and measured_choice says what
/// was timed and what it measured.
PlanResult choose_fastest(Chain& chain, const CostTable& costs, PlanResult planned,
                          const std::vector<CandidatePlan>& candidates, const at::Tensor& sample_input, int steps,
                          ThreadsWhileTiming threads = ThreadsWhileTiming::arranged, int max_series = 1);

/// The generic rules of thumb (generic_policy_candidates, planner.h) that the cost model cannot
/// separate from `planned`: predicted to fit its budget and to be at most `margin` of the unchecked
/// step (or the predictions' spreads) slower; the fastest predicted first, `options.candidates()` at most.
std::vector<CandidatePlan> nearest_rules_of_thumb(const Chain& chain, const CostTable& costs, const PlanResult& planned,
                                                  const MeasuredChoiceOptions& options = {});

/// `planned` timed against nearest_rules_of_thumb (choose_fastest) when `options.when()` says so;
/// otherwise returned with measured_choice.reason saying why not.
PlanResult choose_by_measurement(Chain& chain, const CostTable& costs, PlanResult planned,
                                 const at::Tensor& sample_input, const MeasuredChoiceOptions& options = {},
                                 ThreadsWhileTiming threads = ThreadsWhileTiming::arranged);

/// Profiles `chain` on `sample_input` (the model's input; the chain's loss, if it has one, set up
/// for it), plans for `budget` and verifies the plan on it (max_replans). Profiling and measuring
/// leave the model's gradients, buffers and the RNG streams as they were. Throws when no plan fits,
/// naming the least feasible budget. The verified plan is then timed against the nearest rules of
/// thumb where that is cheap (BudgetPlanOptions::choice, choose_by_measurement).
PlanResult plan_for_budget(Chain& chain, const at::Tensor& sample_input, const Budget& budget,
                           const BudgetPlanOptions& options = {});

}  // namespace remat
