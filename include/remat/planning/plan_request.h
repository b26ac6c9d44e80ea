// remat/planning/plan_request.h — which plan a run uses, decided in one place: a policy, a saved plan, or the
// optimal plan for a memory budget, in a checkpoint mode.
//
//   remat::PlanRequest request = remat::PlanRequest::of_budget("50%").mode(remat::CheckpointMode::non_reentrant);
//   remat::ChosenPlan chosen = remat::choose_plan(request, {
//       [&](const std::string& policy) { return remat::policy_plan(policy, chain); },   // policies.h
//       [&](const remat::ProfileOptions& o) { return remat::profile_chain(chain, sample, o); }});  // budgets only
//   std::cout << chosen.source << "\n";                // "optimal for budget 50% = 12.0 MiB, ..."
//   at::Tensor loss = remat::run_plan(chain, chosen.plan, x);
//
// Training loops, command-line programs and services that accept "a policy, a plan file or a
// budget" build a request and call choose_plan; the model supplies how it makes a policy's plan and
// its cost table (profiled or estimated), asked for only when a budget needs it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <torch/arg.h>

#include "remat/planning/budget_planner.h"
#include "remat/planning/planner.h"

namespace remat {

class PlanRequest {
 public:
  enum class Kind { policy, plan, budget };

  /// A policy by name, as the model's policy builder spells it ("block", "every:2,skip-ends").
  static PlanRequest of_policy(std::string policy);
  /// A plan already made (Plan::from_json of a saved one); `source` names it in reports.
  static PlanRequest of_plan(Plan plan, std::string source);
  /// A plan saved with Plan::to_json, read and parsed now (a clear error naming the file if it is
  /// not one); `max_stages` as in Plan::from_json (-1: no bound).
  static PlanRequest of_plan_file(const std::string& path, int64_t max_stages = -1);
  /// The optimal plan for `budget` (planner.h).
  static PlanRequest of_budget(Budget budget);

  /// The mode of a policy's or a budget's plan (a given plan keeps its own), and the planner's
  /// memory grid for a budget.
  TORCH_ARG(PlannerOptions, planner) = {};
  /// How PlanSources::costs profiles the chain for a budget, in the planner's mode.
  TORCH_ARG(ProfileOptions, profile) = budget_profile_options();
  /// For a budget whose sources can measure (PlanSources::measure_peak): how many times to plan
  /// again when the plan's measured peak passes the budget (plan_verified).
  TORCH_ARG(int, max_replans) = kDefaultMaxReplans;

 public:
  /// The mode plans run in, for the planner and the profile at once.
  PlanRequest& mode(CheckpointMode mode) {
    planner_.mode(mode);
    profile_.mode(mode);
    return *this;
  }
  CheckpointMode mode() const { return planner_.mode(); }

  Kind kind() const { return kind_; }
  /// The policy (Kind::policy), the plan's source (Kind::plan) or the budget's text (Kind::budget).
  const std::string& name() const { return name_; }
  const Plan& plan() const;      ///< Kind::plan only
  const Budget& budget() const;  ///< Kind::budget only
  /// "policy block", "plan plan.json", "budget 50%".
  std::string describe() const;

 private:
  PlanRequest(Kind kind, std::string name) : kind_(kind), name_(std::move(name)) {}
  Kind kind_;
  std::string name_;
  std::optional<Plan> plan_;
  std::optional<Budget> budget_;
};

/// How a model makes what a request names.
struct PlanSources {
  /// A policy's plan for the model's chain; throws a clear error for a policy it does not know.
  std::function<Plan(const std::string& policy)> policy;
  /// The chain's cost table, profiled with the options given (the request's profile(), in its
  /// mode) or estimated; called only for a budget.
  std::function<CostTable(const ProfileOptions&)> costs;
  /// Measures a plan's activation peak on the model (measure_plan_peak); where given, a budget's
  /// plan is verified to fit (plan_verified). Optional: without it the prediction is trusted.
  MeasurePeak measure_peak;
};

/// The plan a request names, with where it came from.
struct ChosenPlan {
  Plan plan;
  /// For reports: "policy block", the plan's source, or "optimal for budget 50% = 12.0 MiB, predicted
  /// peak 11.8 MiB, overhead 23%".
  std::string source;
  /// The planner's result, for a budget.
  std::optional<PlanResult> planned;
};

/// The plan `request` names: the policy's (in the request's mode), the given plan, or the optimal plan
/// for the budget on `sources.costs(request.profile())`, verified with `sources.measure_peak` where given. Throws when
/// the budget is below what any plan needs (or measures), naming the least feasible budget, and when
/// `sources` lacks what the request needs.
ChosenPlan choose_plan(const PlanRequest& request, const PlanSources& sources);

}  // namespace remat
