#include "remat/planning/plan_request.h"

#include <cmath>

#include "remat/base/error.h"
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

ChosenPlan choose_plan(const PlanRequest& request, const PlanSources& sources) {
  ChosenPlan chosen;
  switch (request.kind()) {
    case PlanRequest::Kind::policy:
      REMAT_CHECK(static_cast<bool>(sources.policy), "choose_plan: ", request.describe(),
                  " needs PlanSources::policy, the model's policy builder.");
      chosen.plan = sources.policy(request.name());
      chosen.plan.mode = request.mode();
      chosen.source = request.describe();
      break;
    case PlanRequest::Kind::plan:
      chosen.plan = request.plan();
      chosen.source = request.name();
      break;
    case PlanRequest::Kind::budget: {
      REMAT_CHECK(static_cast<bool>(sources.costs), "choose_plan: ", request.describe(),
                  " needs PlanSources::costs, the chain's cost table.");
      const PlannerOptions& options = request.planner();
      const CostTable costs = sources.costs(ProfileOptions(request.profile()).mode(options.mode()));
      const PlanResult& planned =
          chosen.planned.emplace(sources.measure_peak ? plan_verified(costs, request.budget(), options,
                                                                      sources.measure_peak, request.max_replans())
                                                      : plan_optimal(costs, request.budget(), options));
      planned.ensure_feasible();
      chosen.plan = planned.plan;
      chosen.source = "optimal for budget " + request.name() + " = " + format_bytes(planned.budget_bytes) +
                      ", predicted peak " + format_bytes(planned.prediction.peak_bytes);
      if (planned.measured_peak_bytes >= 0) {
        chosen.source += ", measured " + format_bytes(planned.measured_peak_bytes) +
                         (planned.replans > 0 ? " after " + std::to_string(planned.replans) + " re-plans" : "");
      }
      chosen.source +=
          ", overhead " + std::to_string(static_cast<int>(std::lround(100.0 * planned.predicted_overhead()))) + "%";
      break;
    }
  }
  return chosen;
}

}  // namespace remat
