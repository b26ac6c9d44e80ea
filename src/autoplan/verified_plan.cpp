#include "autoplan/verified_plan.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "remat/base/error.h"
#include "remat/memory/memory.h"
#include "remat/measure/plan_measurement.h"
#include "remat/chain/policies.h"
#include "remat/measure/profiler.h"

namespace remat {

PlanResult plan_verified(const CostTable& costs, const Budget& budget, const PlannerOptions& options,
                         const MeasurePeak& measure_peak, int max_replans, int64_t measured_budget_bytes) {
  REMAT_CHECK(static_cast<bool>(measure_peak), "plan_verified: give a function measuring a plan's peak.");
  REMAT_CHECK(max_replans >= 0, "plan_verified: max_replans must be 0 or more, got ", max_replans, ".");
  REMAT_CHECK(measured_budget_bytes == -1 || measured_budget_bytes > 0,
              "plan_verified: measured_budget_bytes must be positive, or -1 for the planned budget; got ",
              measured_budget_bytes, ".");
  PlanResult result = plan_optimal(costs, budget, options);
  const bool own_units = measured_budget_bytes > 0;
  if (!result.feasible && !own_units) return result;  // infeasible as predicted: nothing to run
  // The planner plans in predicted bytes; the plan is verified in measured bytes. Their ratio turns
  // a measured overshoot into the predicted bytes a re-plan lowers its budget by.
  const int64_t planned_bytes = std::max<int64_t>(result.budget_bytes, 1);
  const int64_t budget_bytes = own_units ? measured_budget_bytes : planned_bytes;
  const double measured_per_predicted = static_cast<double>(budget_bytes) / static_cast<double>(planned_bytes);
  // One table for every re-plan: they only ask lower budgets.
  const OptimalPlanner planner(costs, options, planned_bytes);
  PlanResult least = result;
  if (result.feasible) {
    double worst_error = 0;  // measured over predicted (in predicted bytes), the largest seen
    for (int round = 0;; ++round) {
      result.measured_peak_bytes = measure_peak(result.plan);
      result.replans = round;
      result.budget_bytes = budget_bytes;
      if (result.measured_peak_bytes <= budget_bytes) return result;
      worst_error = std::max(worst_error, static_cast<double>(result.measured_peak_bytes) / measured_per_predicted -
                                              static_cast<double>(result.prediction.peak_bytes));
      if (round == max_replans) break;
      PlanResult next = planner.plan(planned_bytes - static_cast<int64_t>(std::ceil(worst_error)));
      if (!next.feasible || next.plan.to_string() == result.plan.to_string()) break;  // nothing new to measure
      next.budget_bytes = budget_bytes;
      next.solve_seconds = result.solve_seconds;
      result = std::move(next);
    }
    least = result;
  }
  // The least-memory plan: it fits, or nothing does (also where none was predicted to fit a budget
  // in measured bytes: the prediction may overshoot).
  least.plan = planner.least_memory_plan();
  least.prediction = simulate(least.plan, costs);
  least.measured_peak_bytes = measure_peak(least.plan);
  least.replans = result.feasible ? result.replans + 1 : 0;
  least.budget_bytes = budget_bytes;
  least.feasible = least.measured_peak_bytes <= budget_bytes;
  if (least.feasible) {
    least.least_feasible_budget_bytes = -1;
    return least;
  }
  result.feasible = false;
  result.budget_bytes = budget_bytes;
  if (result.measured_peak_bytes < 0) result.measured_peak_bytes = least.measured_peak_bytes;
  result.least_feasible_budget_bytes = least.measured_peak_bytes;
  return result;
}

PlanResult plan_verified(Chain& chain, const CostTable& costs, const at::Tensor& sample_input, const Budget& budget,
                         const PlannerOptions& options, int max_replans, int64_t unchecked_peak_bytes) {
  REMAT_CHECK(unchecked_peak_bytes == -1 || unchecked_peak_bytes > 0,
              "plan_verified: unchecked_peak_bytes must be a measured peak (positive), or -1 to measure it; got ",
              unchecked_peak_bytes, ".");
  const MeasurePeak measure_peak = [&](const Plan& plan) { return measure_plan_peak(chain, plan, sample_input); };
  // A share ("50%") is of the peak a user measures, not of the simulator's. The plan is chosen at
  // the same share of the predicted peak, then verified in measured bytes.
  if (budget.is_relative() && unchecked_peak_bytes < 0) {
    unchecked_peak_bytes = measure_peak(costs.unchecked_plan(options.mode()));
  }
  const int64_t measured_budget_bytes =
      budget.is_relative() ? std::max<int64_t>(budget.to_bytes(unchecked_peak_bytes), 1) : -1;
  PlanResult result = plan_verified(costs, budget, options, measure_peak, max_replans, measured_budget_bytes);
  result.measured_unchecked_peak_bytes = budget.is_relative() ? unchecked_peak_bytes : -1;
  return result;
}

namespace {

// The table has a cost for every stage option the plan uses (a profile without the generic option
// "sac" cannot cost the policy "sac").
bool costs_every_option(const CostTable& costs, const Plan& plan) {
  if (plan.options.size() != costs.stages.size()) return false;
  for (size_t i = 0; i < costs.stages.size(); ++i) {
    if (!costs.stages[i].has_option(plan.options[i])) return false;
  }
  return true;
}

// A fitting candidate measured faster than the planned plan (measured[0]) by its median whose
// interval still reaches 1.
bool undecided(const std::vector<PlanMeasurement>& measured, int64_t budget_bytes) {
  for (size_t i = 1; i < measured.size(); ++i) {
    if (measured[i].activation_peak_bytes > budget_bytes) continue;
    const PairedRatio ratio = paired_time_ratios(measured[i], measured[0]);
    if (ratio.median < 1 && ratio.high >= 1) return true;
  }
  return false;
}

}  // namespace

PlanResult choose_fastest(Chain& chain, const CostTable& costs, PlanResult planned,
                          const std::vector<CandidatePlan>& candidates, const at::Tensor& sample_input, int steps,
                          ThreadsWhileTiming threads, int max_series) {
  REMAT_CHECK(planned.feasible, "choose_fastest: the planned result is infeasible; plan a feasible budget first.");
  REMAT_CHECK(steps >= 1, "choose_fastest: steps must be at least 1, got ", steps, ".");
  std::vector<Plan> plans = {planned.plan};
  std::vector<std::string> names = {"planned"};
  for (const auto& c : candidates) {
    plans.push_back(c.plan);
    names.push_back(c.name);
  }
  REMAT_CHECK(max_series >= 1, "choose_fastest: max_series must be at least 1, got ", max_series, ".");
  const auto start = std::chrono::steady_clock::now();
  std::vector<PlanMeasurement> measured = measure_plans(chain, plans, sample_input, steps, {}, threads);
  // Undecided (a candidate faster by its median whose interval still reaches 1): another series,
  // its rounds added to the first's, so that a real difference gets the rounds to show itself.
  for (int series = 1; series < max_series && undecided(measured, planned.budget_bytes); ++series) {
    const std::vector<PlanMeasurement> more = measure_plans(chain, plans, sample_input, steps, {}, threads);
    for (size_t i = 0; i < measured.size(); ++i) {
      measured[i].all_step_seconds.insert(measured[i].all_step_seconds.end(), more[i].all_step_seconds.begin(),
                                          more[i].all_step_seconds.end());
      measured[i].activation_peak_bytes = std::max(measured[i].activation_peak_bytes, more[i].activation_peak_bytes);
    }
  }
  MeasuredChoice choice;
  choice.measured = true;
  choice.steps = static_cast<int>(measured[0].all_step_seconds.size());
  choice.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<Prediction> predictions = {planned.prediction};
  for (const auto& c : candidates) predictions.push_back(simulate(c.plan, costs));
  for (size_t i = 0; i < plans.size(); ++i) {
    MeasuredChoice::Candidate c;
    c.name = names[i];
    c.plan = plans[i].to_string();
    c.predicted_overhead = predicted_overhead(predictions[i], planned.unchecked);
    c.predicted_overhead_spread = predicted_overhead_spread(predictions[i], planned.unchecked);
    const PairedRatio ratio = paired_time_ratios(measured[i], measured[0]);
    c.ratio = ratio.median;
    c.ratio_low = ratio.low;
    c.ratio_high = ratio.high;
    c.measured_peak_bytes = measured[i].activation_peak_bytes;
    c.fits = c.measured_peak_bytes <= planned.budget_bytes;
    // Kept only where faster beyond the spread: 11 steps of a 10 ms step scatter by several points,
    // and a plan picked by its median alone is as often the slower one.
    if (i > 0 && c.fits && c.ratio_high < 1 && c.ratio < choice.candidates[choice.chosen].ratio) choice.chosen = i;
    choice.candidates.push_back(std::move(c));
  }
  const MeasuredChoice::Candidate& kept = choice.candidates[choice.chosen];
  choice.reason =
      "timed against " + std::to_string(candidates.size()) + " rule" + (candidates.size() == 1 ? "" : "s") +
      " of thumb, " + std::to_string(choice.steps) + " interleaved steps each (" +
      std::to_string(static_cast<int>(std::lround(choice.seconds))) + " s): " +
      (choice.chosen == 0 ? "none that fits measured faster than the planned plan beyond the spread"
                          : "'" + kept.name + "' measured faster (" + std::to_string(kept.ratio) +
                                " of the planned step, at most " + std::to_string(kept.ratio_high) + ") and fits");
  if (choice.chosen > 0) {
    // Verified as plan_verified verifies (a chain without a loss back-propagated from ones, held),
    // which measure_plans' sum does not hold: a peak that passes the budget that way is not kept.
    const int64_t peak = measure_plan_peak(chain, plans[choice.chosen], sample_input);
    if (peak <= planned.budget_bytes) {
      planned.plan = plans[choice.chosen];
      planned.prediction = predictions[choice.chosen];
      planned.measured_peak_bytes = peak;
    } else {
      choice.reason += ", but its verified peak passes the budget: the planned plan kept";
      choice.candidates[choice.chosen].fits = false;
      choice.chosen = 0;
    }
  }
  planned.measured_choice = std::move(choice);
  return planned;
}

std::vector<CandidatePlan> nearest_rules_of_thumb(const Chain& chain, const CostTable& costs, const PlanResult& planned,
                                                  const MeasuredChoiceOptions& options) {
  struct Scored {
    CandidatePlan candidate;
    Prediction prediction;
  };
  std::vector<Scored> scored;
  const std::string planned_text = planned.plan.to_string();
  for (const std::string& policy : generic_policy_candidates()) {
    Plan plan;
    try {
      plan = policy_plan(policy, chain);
    } catch (const c10::Error&) {
      continue;  // not applicable to this chain (too few blocks)
    }
    plan.mode = planned.plan.mode;
    if (plan.to_string() == planned_text || !costs_every_option(costs, plan)) continue;
    const Prediction p = simulate(plan, costs);
    if (p.peak_bytes > planned.budget_bytes) continue;
    const double slower = p.step_seconds - planned.prediction.step_seconds;
    const double noise = std::hypot(p.step_seconds_spread, planned.prediction.step_seconds_spread);
    if (slower > std::max(2 * noise, options.margin() * planned.unchecked.step_seconds)) continue;
    bool duplicate = false;
    for (const auto& s : scored) duplicate = duplicate || s.candidate.plan.to_string() == plan.to_string();
    if (!duplicate) scored.push_back({{policy, std::move(plan)}, p});
  }
  std::stable_sort(scored.begin(), scored.end(), [](const Scored& a, const Scored& b) {
    return a.prediction.step_seconds < b.prediction.step_seconds;
  });
  std::vector<CandidatePlan> nearest;
  for (auto& s : scored) {
    if (static_cast<int>(nearest.size()) >= options.candidates()) break;
    nearest.push_back(std::move(s.candidate));
  }
  return nearest;
}

PlanResult choose_by_measurement(Chain& chain, const CostTable& costs, PlanResult planned,
                                 const at::Tensor& sample_input, const MeasuredChoiceOptions& options,
                                 ThreadsWhileTiming threads) {
  REMAT_CHECK(options.candidates() >= 0 && options.steps() >= 1 && options.max_series() >= 1 &&
                  options.max_seconds() >= 0 && std::isfinite(options.max_seconds()),
              "choose_by_measurement: candidates must be >= 0, steps and max_series >= 1 and max_seconds finite and ",
              ">= 0, got ", options.candidates(), ", ", options.steps(), ", ", options.max_series(), " and ",
              options.max_seconds(), ".");
  if (!planned.feasible) return planned;
  MeasuredChoice& choice = planned.measured_choice;
  if (options.when() == ChooseByMeasurement::never) {
    choice.reason = "not timed against rules of thumb (MeasuredChoiceOptions::when is never)";
    return planned;
  }
  const std::vector<CandidatePlan> nearest = nearest_rules_of_thumb(chain, costs, planned, options);
  if (nearest.empty()) {
    choice.reason = "no rule of thumb that fits is predicted within the noise of the plan: none timed";
    return planned;
  }
  // A short step is measured after an untimed one of its own (measure_plans): twice the steps.
  const double step = planned.unchecked.step_seconds * (planned.unchecked.step_seconds < 0.05 ? 2 : 1);
  const double estimate = static_cast<double>((nearest.size() + 1) * (options.steps() + 1)) * step;
  const bool automatic = options.when() == ChooseByMeasurement::automatic;
  if (automatic && estimate > options.max_seconds()) {
    choice.reason = "not timed against " + std::to_string(nearest.size()) + " rules of thumb predicted within its " +
                    "noise: the series would take about " + std::to_string(static_cast<int>(std::lround(estimate))) +
                    " s, over MeasuredChoiceOptions::max_seconds (" +
                    std::to_string(static_cast<int>(std::lround(options.max_seconds()))) + " s)";
    return planned;
  }
  // Series beyond the first only as far as max_seconds allows, where it decides.
  const double affordable = std::floor(options.max_seconds() / std::max(estimate, 1e-9));
  const int series = automatic
                         ? static_cast<int>(std::clamp(affordable, 1.0, static_cast<double>(options.max_series())))
                         : options.max_series();
  return choose_fastest(chain, costs, std::move(planned), nearest, sample_input, options.steps(), threads, series);
}

}  // namespace remat
