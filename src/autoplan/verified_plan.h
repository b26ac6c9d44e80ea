// The steps of make_plan (make_plan.h) after the profile, for a budget: verify the plan in measured
// steps and re-plan while it passes; time it against the rules of thumb the cost model cannot
// separate from it. Private to the autoplan room (the tests reach them to test each step alone).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "remat/autoplan/make_plan.h"
#include "remat/base/threads.h"
#include "remat/measure/plan_measurement.h"

namespace remat {

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
/// predicted one (make_plan); the least-memory plan is then measured even where no plan was
/// predicted to fit.
PlanResult plan_verified(const CostTable& costs, const Budget& budget, const PlannerOptions& options,
                         const MeasurePeak& measure_peak, int max_replans = kDefaultMaxReplans,
                         int64_t measured_budget_bytes = -1);

/// plan_verified on `chain` itself, as make_plan verifies once it has profiled: each plan
/// measured by measure_plan_peak on `sample_input`, and a share ("50%") taken of the unchecked
/// step's measured peak: `unchecked_peak_bytes` where the caller has measured it (to plan several
/// budgets on one measurement), else one unchecked step is run. The result records it
/// (measured_unchecked_peak_bytes; -1 for an absolute budget, which needs none).
PlanResult plan_verified(Chain& chain, const CostTable& costs, const at::Tensor& sample_input, const Budget& budget,
                         const PlannerOptions& options = {}, int max_replans = kDefaultMaxReplans,
                         int64_t unchecked_peak_bytes = -1);

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

}  // namespace remat
