// remat/autoplan/make_plan.h — the one front door for deciding a run's plan: a policy, a saved plan,
// or the optimal plan for a memory budget, made for your chain in one call.
//
//   remat::SequentialChain chain(net, [&](const at::Tensor& out) { return F::cross_entropy(out, labels); });
//   remat::PlanResult r = remat::make_plan(remat::PlanRequest::of_budget("50%"), {chain, images});
//   std::cout << r.source << "\n";                    // "optimal for budget 50% = 12.0 MiB, ..."
//   at::Tensor loss = remat::run_plan(chain, r.plan, images);               // every training step
//
// A request says which plan (of_policy, of_plan, of_plan_file, of_budget) and how it is made
// (PlanningOptions: the checkpoint mode, given once, and the profile, verification and measured
// choice); the subject says what it is made for. For a budget on a chain: profile (measure/) →
// solve (planning/: the optimal dynamic program) → verify (one measured step; planned again for a
// lower budget while the measured peak passes) → measured choice (the plan timed against the rules
// of thumb the cost model cannot tell from it, the fastest kept). On a cost table alone (estimated,
// loaded), the prediction is trusted. A share ("50%") is of the unchecked step's activation peak as
// measured where the plan is verified (a chain given; PlanResult::measured_unchecked_peak_bytes),
// else as predicted.
// Any model's step, its forward untouched (PlanSubject::of_step): recorded once, planned over its
// graph, run with PlanResult::step:
//   remat::PlanResult r = remat::make_plan(remat::PlanRequest::of_budget("50%"),
//                                          remat::PlanSubject::of_step(forward, state));
//   at::Tensor loss = r.step->run(forward);                                  // every training step
// An impossible budget throws, naming the least feasible one. Profiling and measuring leave the
// model's gradients, buffers and RNG streams as they were.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/arg.h>

#include "remat/chain/chain.h"
#include "remat/graph/planned_step.h"
#include "remat/measure/profiler.h"
#include "remat/planning/planner.h"

namespace remat {

/// When a budget's plan is timed against the rules of thumb nearest it.
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

/// How often a plan is planned again when its measured peak passes the budget.
constexpr int kDefaultMaxReplans = 3;

/// How a plan is made. The checkpoint mode is the planner's (planner().mode(), or mode()): the
/// profile is taken in it and a policy's plan runs in it.
struct PlanningOptions {
  /// The checkpoint mode plans run in, and the dynamic program's memory grid.
  TORCH_ARG(PlannerOptions, planner) = {};
  /// How the chain is profiled for a budget (repeats, warm-up, threads); by default with the generic
  /// option "sac" (kSacOption, chain.h) on every stage, so the planner can choose it where it pays.
  TORCH_ARG(ProfileOptions, profile) = ProfileOptions().sac_option(true);
  /// Plans again at most this many times when the plan's measured peak passes the budget; -1: do not
  /// verify (trust the predicted peak; a share is then of the predicted unchecked peak). The
  /// measured choice, which times steps, is turned off on its own: choice().when(never).
  TORCH_ARG(int, max_replans) = kDefaultMaxReplans;
  /// The verified plan timed against the nearest rules of thumb, the fastest kept.
  TORCH_ARG(MeasuredChoiceOptions, choice) = {};

 public:
  PlanningOptions& mode(CheckpointMode mode) {
    planner_.mode(mode);
    return *this;
  }
  CheckpointMode mode() const { return planner_.mode(); }
};

/// Which plan a run uses, and how it is made.
class PlanRequest {
 public:
  enum class Kind { policy, plan, budget };

  /// A policy by name, as policies.h (or the subject's own policies) spell it: "block", "every:2,skip-ends".
  static PlanRequest of_policy(std::string policy);
  /// A plan already made (Plan::from_json of a saved one) in its own mode; `source` names it in reports.
  static PlanRequest of_plan(Plan plan, std::string source);
  /// A plan saved with Plan::to_json, read and parsed now (a clear error naming the file if it is
  /// not one); `max_stages` as in Plan::from_json (-1: no bound).
  static PlanRequest of_plan_file(const std::string& path, int64_t max_stages = -1);
  /// The optimal plan for `budget` (planner.h), verified and measured where the subject can run.
  static PlanRequest of_budget(Budget budget);

  TORCH_ARG(PlanningOptions, options) = {};

 public:
  /// The mode of a policy's or a budget's plan (a given plan keeps its own).
  PlanRequest& mode(CheckpointMode mode) {
    options_.mode(mode);
    return *this;
  }
  CheckpointMode mode() const { return options_.mode(); }

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

/// What a plan is made for: a chain and a sample of its input (the model's input; the chain's loss,
/// if it has one, set up for it), profiled and measured on; or a cost table alone; or any model's
/// training step (of_step), planned over its graph.
class PlanSubject {
 public:
  /// Any model's training step: `forward` runs its forward and returns the loss. A budget is planned
  /// over the step's graph (remat/graph/planned_step.h): make_plan runs the step once, forward and
  /// backward, to record it, plans it, and returns the planned step in PlanResult::step to run every
  /// training step with. The run leaves `state` (a model's parameters and buffers: their gradients and
  /// values) and the RNG streams of its devices as they were (ChainStateGuard). Policies and plans are for chains: refused here.
  static PlanSubject of_step(std::function<at::Tensor()> forward, std::vector<at::Tensor> state = {},
                             PlannedStepOptions options = {});
  bool is_step() const { return static_cast<bool>(step_forward_); }
  const std::function<at::Tensor()>& step_forward() const { return step_forward_; }
  const std::vector<at::Tensor>& step_state() const { return step_state_; }
  const PlannedStepOptions& step_options() const { return step_options_; }

  /// Nothing to run or cost: given plans, and policies by the builder given (policies()).
  PlanSubject() = default;
  /// The chain is used during make_plan only, not kept.
  PlanSubject(Chain& chain, at::Tensor sample_input);
  /// As above, sharing the chain (one built for planning, as a model's planning helper returns).
  PlanSubject(std::shared_ptr<Chain> chain, at::Tensor sample_input);
  /// A cost table alone (estimated or loaded): nothing is run, a budget's plan is predicted only.
  explicit PlanSubject(CostTable costs);

  /// Plan on these costs rather than profiling the chain (a table profiled already, for several
  /// budgets or batch sizes); where a chain is given, it still verifies and times the plan.
  PlanSubject& costs(CostTable costs);
  /// How a policy's plan is made; default: policy_plan(policy, chain) (policies.h). A model with
  /// policies of its own (by another granularity) gives its builder.
  PlanSubject& policies(std::function<Plan(const std::string& policy)> build);
  /// How a plan given or built is checked against the model (a clear error for one made for another
  /// model); default: Plan::validate_against(chain), where the subject has a chain and no policies
  /// of its own. A model whose plans come in several granularities gives its own check.
  PlanSubject& check_plans(std::function<void(const Plan&)> check);

  Chain* chain() const { return chain_; }
  const at::Tensor& sample_input() const { return sample_input_; }
  const std::optional<CostTable>& given_costs() const { return costs_; }
  /// The policy's plan, by the builder given or policy_plan on the chain.
  Plan policy_plan(const std::string& policy) const;

 private:
  std::shared_ptr<Chain> owned_;
  Chain* chain_ = nullptr;
  at::Tensor sample_input_;
  std::optional<CostTable> costs_;
  std::function<Plan(const std::string&)> policies_;
  std::function<void(const Plan&)> check_plans_;
  std::function<at::Tensor()> step_forward_;
  std::vector<at::Tensor> step_state_;
  PlannedStepOptions step_options_;

  friend PlanResult make_plan(const PlanRequest& request, const PlanSubject& subject);
};

/// The plan `request` names, made for `subject`: the policy's (in the request's mode), the given
/// plan, or the optimal plan for the budget (profiled, solved, verified, timed against the nearest
/// rules of thumb: see the top of this header). PlanResult::source says where it came from. Throws
/// when the budget is below what any plan needs or measures (naming the least feasible budget), and
/// when the subject lacks what the request needs (a budget needs a chain, a cost table or a step).
PlanResult make_plan(const PlanRequest& request, const PlanSubject& subject);

}  // namespace remat
