// remat/budget_planner.h — "give it a memory budget, it chooses what to keep", in one call, for
// any chain (your own model through SequentialChain, or a Chain of your own).
//
//   remat::SequentialChain chain(net, [&](const at::Tensor& out) { return F::cross_entropy(out, labels); });
//   remat::BudgetPlan p = remat::plan_for_budget(chain, images, "50%");   // profiles, then plans
//   std::cout << p.plan.to_string() << ", predicted peak " << p.prediction.peak_bytes << " bytes\n";
//   at::Tensor loss = remat::run_plan(chain, p.plan, images);             // every training step
//
// The plan is the optimal planner's (planner.h) on the measured cost table (profiler.h); a budget
// below what any plan needs is an error naming the least feasible budget. compare_planners costs
// the rules of thumb and the classic planners at the same budget, for reports.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/arg.h>

#include "remat/cost_model.h"
#include "remat/plan.h"

namespace remat {

/// A budget for activation memory: bytes, or text — "512MiB", "2GiB", "800KiB", "123456B", or
/// "50%" of the unchecked plan's predicted activation peak.
class Budget {
 public:
  Budget(int bytes);  // NOLINT: implicit, so that plan_for_budget(chain, x, 256 << 20) reads well
  Budget(int64_t bytes);  // NOLINT
  Budget(const char* text);  // NOLINT
  Budget(std::string text);  // NOLINT
  /// The budget in bytes, percentages taken of `unchecked_peak_bytes`. Throws for malformed text.
  int64_t bytes(int64_t unchecked_peak_bytes) const;
  /// As given: "50%", or the number of bytes.
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

struct BudgetPlanOptions {
  /// Measured profiling runs per stage and option; times are their medians.
  TORCH_ARG(int, repeats) = 3;
  /// Unmeasured profiling runs first.
  TORCH_ARG(int, warmup) = 1;
  /// Memory grid of the dynamic program: the budget is cut into this many units.
  TORCH_ARG(int64_t, memory_slots) = 1000;
  /// The checkpoint mode the plan will run in (the planner counts what each mode holds).
  TORCH_ARG(CheckpointMode, mode) = CheckpointMode::reentrant;
};

/// The fastest plan predicted to fit a budget, with what it was planned from.
struct BudgetPlan {
  Plan plan;
  Prediction prediction;              ///< the simulator's, for `plan`
  Prediction unchecked;               ///< the simulator's, for the plain plan
  int64_t budget_bytes = 0;
  int64_t min_feasible_budget_bytes = 0;  ///< the least budget any plan fits (on a refined grid)
  double solve_seconds = 0;
  CostTable costs;                    ///< the cost table it was planned on

  /// Predicted step time over the unchecked plan's, minus one (0.05 = 5% slower).
  double predicted_overhead() const;
};

/// Profiles `chain` on `sample_input` (the model's input; the chain's loss, if it has one, set up
/// for it) and plans for `budget`. Profiling leaves the model's gradients, buffers and the RNG
/// streams as they were. Throws when no plan fits, naming the least feasible budget.
BudgetPlan plan_for_budget(Chain& chain, const at::Tensor& sample_input, const Budget& budget,
                           const BudgetPlanOptions& options = {});

/// Plans on a cost table already measured (or estimated) for the chain of `plan_template`
/// (Plan::plain(chain)). Throws when no plan fits, naming the least feasible budget.
BudgetPlan plan_for_budget(const CostTable& costs, const Plan& plan_template, const Budget& budget,
                           int64_t memory_slots = 1000);

/// The least budget for which some plan is predicted to fit (bytes); -1 when none does.
int64_t least_feasible_budget(const CostTable& costs, const Plan& plan_template, int64_t memory_slots = 1000);

/// A plan a rule of thumb or a classic planner chose, and its prediction.
struct PlanCandidate {
  std::string name;        ///< a policy, "revolve" or "chen"
  bool feasible = false;   ///< predicted to fit the budget
  Plan plan;               ///< empty when the planner found none
  Prediction prediction;
};

/// Every policy in `policies` (built by `build`, costed by `predict`; a policy that does not apply
/// to the chain is left out) and the Revolve and Chen planners (on `costs`) at `budget_bytes`.
std::vector<PlanCandidate> compare_planners(const CostTable& costs, const Plan& plan_template, int64_t budget_bytes,
                                            const std::vector<std::string>& policies,
                                            const std::function<Plan(const std::string&)>& build,
                                            const std::function<Prediction(const Plan&)>& predict,
                                            int64_t memory_slots = 1000);

/// compare_planners with the generic policies (policies.h), with and without ",skip-ends":
/// block, every:2, every:3, every:4, segments:2, segments:4, sqrt.
std::vector<PlanCandidate> compare_planners(const CostTable& costs, const Chain& chain, int64_t budget_bytes,
                                            int64_t memory_slots = 1000);

/// Each policy, then the same with ",skip-ends".
std::vector<std::string> with_and_without_skip_ends(const std::vector<std::string>& policies);

/// The generic policies compare_planners tries on any chain.
std::vector<std::string> generic_policy_candidates();

}  // namespace remat
