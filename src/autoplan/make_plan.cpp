#include "remat/autoplan/make_plan.h"

#include <cmath>

#include "autoplan/verified_plan.h"
#include "remat/base/error.h"
#include "remat/chain/chain_state.h"
#include "remat/chain/policies.h"
#include "remat/internal/files.h"
#include "remat/memory/memory.h"

namespace remat {

PlanRequest PlanRequest::of_policy(std::string policy) {
  REMAT_CHECK(!policy.empty(), "PlanRequest: the policy is empty; name one, as in \"block\".");
  return PlanRequest(Kind::policy, std::move(policy));
}

PlanRequest PlanRequest::of_plan(Plan plan, std::string source) {
  PlanRequest request(Kind::plan, std::move(source));
  request.mode(plan.mode);
  request.plan_ = std::move(plan);
  return request;
}

PlanRequest PlanRequest::of_plan_file(const std::string& path, int64_t max_stages) {
  return of_plan(Plan::from_json(read_regular_file(path, "plan file"), path, max_stages), path);
}

PlanRequest PlanRequest::of_budget(Budget budget) {
  PlanRequest request(Kind::budget, budget.text());
  request.budget_ = std::move(budget);
  return request;
}

const Plan& PlanRequest::plan() const {
  REMAT_CHECK(plan_.has_value(), "PlanRequest: ", describe(), " holds no plan.");
  return *plan_;
}

const Budget& PlanRequest::budget() const {
  REMAT_CHECK(budget_.has_value(), "PlanRequest: ", describe(), " holds no budget.");
  return *budget_;
}

std::string PlanRequest::describe() const {
  switch (kind_) {
    case Kind::policy:
      return "policy " + name_;
    case Kind::plan:
      return "plan " + name_;
    case Kind::budget:
      return "budget " + name_;
  }
  return name_;
}

PlanSubject::PlanSubject(Chain& chain, at::Tensor sample_input)
    : chain_(&chain), sample_input_(std::move(sample_input)) {
  REMAT_CHECK(sample_input_.defined(),
              "PlanSubject: the sample input is undefined; give a batch of the model's input.");
}

namespace {

Chain& non_null(const std::shared_ptr<Chain>& chain) {
  REMAT_CHECK(chain != nullptr, "PlanSubject: the chain is null.");
  return *chain;
}

}  // namespace

PlanSubject::PlanSubject(std::shared_ptr<Chain> chain, at::Tensor sample_input)
    : PlanSubject(non_null(chain), std::move(sample_input)) {
  owned_ = std::move(chain);
}

PlanSubject::PlanSubject(CostTable costs) : costs_(std::move(costs)) {}

PlanSubject& PlanSubject::costs(CostTable costs) {
  costs_ = std::move(costs);
  return *this;
}

PlanSubject& PlanSubject::policies(std::function<Plan(const std::string&)> build) {
  policies_ = std::move(build);
  return *this;
}

PlanSubject& PlanSubject::check_plans(std::function<void(const Plan&)> check) {
  check_plans_ = std::move(check);
  return *this;
}

Plan PlanSubject::policy_plan(const std::string& policy) const {
  if (policies_) return policies_(policy);
  REMAT_CHECK(chain_ != nullptr, "make_plan: the policy '", policy,
              "' needs the chain it is made for (a PlanSubject of a chain), or the model's policy builder "
              "(PlanSubject::policies).");
  return remat::policy_plan(policy, *chain_);
}

PlanSubject PlanSubject::of_step(std::function<at::Tensor()> forward, std::vector<at::Tensor> state,
                                 PlannedStepOptions options) {
  REMAT_CHECK(static_cast<bool>(forward),
              "PlanSubject::of_step: the step's forward is empty; give a function that "
              "runs the forward and returns the loss.");
  for (size_t i = 0; i < state.size(); ++i) {
    REMAT_CHECK(state[i].defined(), "PlanSubject::of_step: state tensor ", i,
                " is undefined; give the model's parameters and buffers.");
  }
  PlanSubject subject;
  subject.step_forward_ = std::move(forward);
  subject.step_state_ = std::move(state);
  subject.step_options_ = options;
  return subject;
}

namespace {

PlanResult plan_step(const PlanRequest& request, const PlanSubject& subject) {
  REMAT_CHECK(request.kind() == PlanRequest::Kind::budget, "make_plan: a step (PlanSubject::of_step) is planned for ",
              "a budget (PlanRequest::of_budget), not a ", request.describe(),
              ": policies and plans name a chain's stages; give a budget, or plan a chain.");
  auto step = std::make_shared<PlannedStep>(request.budget(), subject.step_options());
  {
    ChainStateGuard untouched(subject.step_state());      // gradients, buffers, RNG streams put back
    at::Tensor loss = step->run(subject.step_forward());  // recorded
    REMAT_CHECK(loss.defined() && loss.numel() == 1 && loss.requires_grad(),
                "make_plan: the step's forward must return the loss, one element that requires grad; it returned ",
                loss.defined() ? "a tensor of " + std::to_string(loss.numel()) + " elements" : "an undefined tensor",
                loss.defined() && !loss.requires_grad() ? " that does not require grad" : "", ".");
    loss.backward();
  }
  const StepPlan& planned = step->plan_now();
  PlanResult result;
  result.planner = PlannerKind::graph;
  result.name = to_string(PlannerKind::graph);
  result.feasible = true;
  result.budget_bytes = planned.budget_bytes;
  result.measured_unchecked_peak_bytes = planned.unchecked_peak_bytes;
  result.prediction.peak_bytes = planned.predicted_peak_bytes;
  result.prediction.step_seconds = planned.recorded_step_seconds + planned.predicted_recompute_seconds;
  result.unchecked.peak_bytes = planned.unchecked_peak_bytes;
  result.unchecked.step_seconds = planned.recorded_step_seconds;
  result.solve_seconds = planned.plan_seconds;
  result.measured_choice.reason = "not timed against rules of thumb: a step planned over its graph has none";
  result.source = "planned over the step's graph for budget " + request.name() + " = " +
                  format_bytes(planned.budget_bytes) + ", predicted peak " +
                  format_bytes(planned.predicted_peak_bytes) + ", recompute " +
                  std::to_string(static_cast<int>(std::lround(planned.predicted_recompute_seconds * 1e3))) + " ms, " +
                  std::to_string(planned.dropped) + " of " + std::to_string(planned.candidates) +
                  " saved memory blocks dropped" + (planned.search.empty() ? "" : " (" + planned.search + ")");
  result.step = std::move(step);
  return result;
}

std::string budget_source(const PlanRequest& request, const PlanResult& planned) {
  std::string source = "optimal for budget " + request.name() + " = " + format_bytes(planned.budget_bytes) +
                       ", predicted peak " + format_bytes(planned.prediction.peak_bytes);
  if (planned.measured_peak_bytes >= 0) {
    source += ", measured " + format_bytes(planned.measured_peak_bytes) +
              (planned.replans > 0 ? " after " + std::to_string(planned.replans) + " re-plans" : "");
  }
  source += ", overhead " + std::to_string(static_cast<int>(std::lround(100.0 * planned.predicted_overhead()))) + "%";
  const MeasuredChoice& choice = planned.measured_choice;
  if (choice.measured && choice.chosen > 0)
    source += ", '" + choice.candidates[choice.chosen].name + "' measured faster";
  return source;
}

PlanResult plan_budget(const PlanRequest& request, const PlanSubject& subject) {
  const PlanningOptions& options = request.options();
  Chain* chain = subject.chain();
  REMAT_CHECK(chain != nullptr || subject.given_costs().has_value(), "make_plan: ", request.describe(),
              " needs the chain it is for (a PlanSubject of a chain and a sample input) or its cost table.");
  const CostTable costs = subject.given_costs()
                              ? *subject.given_costs()
                              : profile_chain(*chain, subject.sample_input(), options.profile(), options.mode());
  if (chain != nullptr && subject.given_costs()) costs.validate_against(*chain);  // a profile is the chain's
  const bool verify = chain != nullptr && options.max_replans() >= 0;
  PlanResult result = verify ? plan_verified(*chain, costs, subject.sample_input(), request.budget(), options.planner(),
                                             options.max_replans())
                             : plan_optimal(costs, request.budget(), options.planner());
  result.ensure_feasible();
  if (chain != nullptr) {
    result = choose_by_measurement(*chain, costs, std::move(result), subject.sample_input(), options.choice(),
                                   options.profile().threads());
  } else {
    result.measured_choice.reason = "not timed against rules of thumb: planned on a cost table alone";
  }
  result.source = budget_source(request, result);
  return result;
}

}  // namespace

PlanResult make_plan(const PlanRequest& request, const PlanSubject& subject) {
  if (subject.is_step()) return plan_step(request, subject);
  if (request.kind() == PlanRequest::Kind::budget) return plan_budget(request, subject);
  PlanResult result;
  result.planner = PlannerKind::policy;
  result.feasible = true;
  if (request.kind() == PlanRequest::Kind::policy) {
    result.plan = subject.policy_plan(request.name());
    result.plan.mode = request.mode();
    result.source = request.describe();
  } else {
    result.plan = request.plan();
    result.source = request.name();
  }
  result.name = request.name();
  if (subject.check_plans_) {
    subject.check_plans_(result.plan);
  } else if (subject.chain() != nullptr && !subject.policies_) {
    // A model's own policies may be of another granularity than the chain planned on (block plans
    // beside a chain of half blocks): then it gives its own check.
    result.plan.validate_against(*subject.chain());
  }
  return result;
}

}  // namespace remat
