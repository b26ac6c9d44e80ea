// remat/planning/planner.h — choosing what to keep under a memory budget, from a chain's cost table.
//
//   remat::PlanResult r = remat::plan_optimal(costs, "50%");     // or Budget::bytes(512 << 20)
//   if (r.feasible) run_plan(chain, r.plan, x);                     // the fastest plan predicted to fit
//   else std::cout << "needs at least " << r.least_feasible_budget_bytes << " bytes\n";
//
// Every planner answers with a PlanResult, a status: an impossible budget is a result, not an
// exception (make_plan in remat/autoplan/make_plan.h, the front door that also profiles and
// verifies, throws; PlanResult::ensure_feasible turns a status into one). Plans take their stage names, granularity
// and default options from the cost table; run_plan checks them by name against the chain.
//
// The optimal planner is the dynamic program over nested segments of rotor (Beaumont et al. 2019)
// for heterogeneous chains, choosing each stage's option too; its predictions are the simulator's
// (cost_model.h), so a plan it returns replays to exactly its cost. Memory is discretised into
// `memory_slots` units of ceil(max_budget / slots) bytes: sizes round up and budgets down, so a plan
// feasible in units fits in bytes (and where rounding made the table pessimistic, rows above the
// budget's are tried while the simulator says their plans still fit). Each range keeps only its
// window of slots (from the least that fits to the least above which nothing changes), and the
// table is bounded (256 MiB, 10^9 slot updates): exact on chains of hundreds of stages, on longer
// ones segments are limited in length (max_segment_stages). Revolve and
// Chen's greedy rule are the classic planners, for comparison; both read the chain's blocks
// (StageInfo::block), not positions: Revolve averages the block stages' costs, Chen cuts runs of
// block stages and leaves stages outside blocks plain.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/arg.h>

#include "remat/planning/budget.h"
#include "remat/planning/cost_model.h"

namespace remat {

class PlannedStep;
/// The memory grid every planner uses unless told otherwise.
constexpr int64_t kDefaultMemorySlots = 1000;

struct PlannerOptions {
  /// The checkpoint mode plans will run in (the planner counts what each mode holds).
  TORCH_ARG(CheckpointMode, mode) = CheckpointMode::reentrant;
  /// Memory grid of the dynamic program: the largest budget it answers is cut into this many units.
  TORCH_ARG(int64_t, memory_slots) = kDefaultMemorySlots;
};

enum class PlannerKind { optimal, revolve, chen, policy, graph };
/// "optimal", "revolve", "chen", "policy" or "graph" (a step planned over its graph: PlanSubject::of_step).
std::string to_string(PlannerKind kind);

/// A plan timed against the rules of thumb nearest it, and the one kept (make_plan).
struct MeasuredChoice {
  struct Candidate {
    std::string name;  ///< "planned" for the planner's own plan, else the policy
    std::string plan;  ///< Plan::to_string
    double predicted_overhead = 0, predicted_overhead_spread = 0;
    /// Step time over the planned plan's, paired per round: median and ~95% interval.
    double ratio = 1, ratio_low = 1, ratio_high = 1;
    int64_t measured_peak_bytes = -1;
    bool fits = false;  ///< measured peak within the budget
  };
  bool measured = false;
  /// Why it was or was not measured, and what it kept.
  std::string reason;
  std::vector<Candidate> candidates;  ///< [0]: the planner's own plan
  size_t chosen = 0;                  ///< index into candidates
  int steps = 0;                      ///< interleaved steps per candidate, all series together
  double seconds = 0;                 ///< what the measured series took
};

/// What a planner chose for one budget.
struct PlanResult {
  PlannerKind planner = PlannerKind::optimal;
  std::string name;  ///< the policy for PlannerKind::policy; otherwise to_string(planner)
  /// Where the plan came from, for reports (make_plan): "policy block", a plan file's path, or
  /// "optimal for budget 50% = 12.0 MiB, predicted peak 11.8 MiB, measured ..., overhead 23%".
  std::string source;
  bool feasible = false;  ///< predicted to fit the budget
  Plan plan;              ///< the choice; for the optimal planner empty when infeasible
  Prediction prediction;  ///< the simulator's, for `plan`
  Prediction unchecked;   ///< the simulator's, for the plan that checkpoints nothing
  /// In predicted bytes, or in measured ones where a share was resolved against the measured
  /// unchecked peak (make_plan on a chain): then the plan was chosen at that share of the predicted peak.
  int64_t budget_bytes = 0;
  /// The least budget for which this planner finds a plan (the predicted peak of its least-memory
  /// plan; for the optimal planner on a grid within 0.2% of that peak); -1 when it finds none.
  int64_t least_feasible_budget_bytes = -1;
  double solve_seconds = 0;
  /// Where the plan was run to check it fits (make_plan): its activation peak
  /// in one measured step; -1 when not measured. When verification finds no plan within the budget,
  /// `feasible` is false and least_feasible_budget_bytes is the least-memory plan's measured peak.
  int64_t measured_peak_bytes = -1;
  /// How many times verification planned again, each time for a budget lowered by the overshoot.
  int replans = 0;
  /// The unchecked step's activation peak as measured, where a share ("50%") was resolved against it
  /// (make_plan on a chain); -1 where the share was of the predicted peak (unchecked.peak_bytes).
  int64_t measured_unchecked_peak_bytes = -1;
  /// The CPU threads the costs were timed under (CostTable::threads); empty where unknown.
  std::string timed_under;
  /// Where the plan was timed against its nearest rules of thumb (make_plan); its
  /// `measured` is false where it was not.
  MeasuredChoice measured_choice;
  /// For a step (PlanSubject::of_step, PlannerKind::graph): the step planned over its graph, to run
  /// every training step with (PlannedStep::run; remat/graph/planned_step.h); null for chains.
  std::shared_ptr<PlannedStep> step;

  /// Predicted step time over the unchecked plan's, minus one (0.05 = 5% slower).
  double predicted_overhead() const;
  /// The half-width of a ~95% interval of predicted_overhead() (predicted_overhead_spread).
  double predicted_overhead_spread() const;
  /// Returns *this when feasible; otherwise throws a clear error naming the least feasible budget.
  const PlanResult& ensure_feasible() const;
};

/// The fastest plan predicted to fit `budget` (a share is of the unchecked predicted peak: no step
/// is run; make_plan takes it of the measured one).
PlanResult plan_optimal(const CostTable& costs, const Budget& budget, const PlannerOptions& options = {});

/// The least budget for which the optimal planner finds a plan (bytes, within 0.2%); -1 when none.
int64_t least_feasible_budget(const CostTable& costs, const PlannerOptions& options = {});

/// Revolve (Griewank & Walther's binomial checkpointing) for homogeneous chains: the optimal plan
/// for the chain with every block stage's cost replaced by the mean block stage's, at the largest
/// uniform budget whose plan, costed on the real chain, fits the budget.
PlanResult revolve_plan(const CostTable& costs, const Budget& budget, const PlannerOptions& options = {});

/// Chen et al.'s greedy-for-budget: runs of block stages are cut into checkpointed segments
/// whenever the running sum of kept bytes exceeds a threshold; the threshold giving the fastest
/// plan that fits wins. Stages outside blocks run plainly.
PlanResult chen_greedy_plan(const CostTable& costs, const Budget& budget, const PlannerOptions& options = {});

/// Rules of thumb beside the classic planners, at one budget: each policy in `policies` (its plan
/// made by `build`, costed by `predict`; a policy `build` refuses for this chain is left out), then
/// Revolve and Chen on `costs`. Each result is tagged with its PlannerKind.
std::vector<PlanResult> compare_planners(const CostTable& costs, const Budget& budget,
                                         const std::vector<std::string>& policies,
                                         const std::function<Plan(const std::string&)>& build,
                                         const std::function<Prediction(const Plan&)>& predict,
                                         const PlannerOptions& options = {});

/// compare_planners with generic_policy_candidates (policies.h) for `chain`, costed by the simulator.
std::vector<PlanResult> compare_planners(const CostTable& costs, const Chain& chain, const Budget& budget,
                                         const PlannerOptions& options = {});

/// The optimal planner's table, for callers asking many budgets of one chain (plan_optimal builds
/// one per call, spanning [0, budget]). Copies share the (immutable) table.
class OptimalPlanner {
 public:
  /// Budgets up to `max_budget_bytes` (default: twice the unchecked plan's predicted peak) are answered.
  explicit OptimalPlanner(CostTable costs, const PlannerOptions& options = {}, int64_t max_budget_bytes = 0);

  PlanResult plan(int64_t budget_bytes) const;
  /// The table's least predicted time for a budget (+inf when infeasible), without backtracking.
  double least_seconds(int64_t budget_bytes) const;
  /// PlanResult::least_feasible_budget_bytes (refined below this table's grid where it is coarse).
  int64_t least_feasible_budget_bytes() const;
  /// The plan of least predicted peak this table holds (empty when the chain never fits).
  const Plan& least_memory_plan() const;
  const Prediction& unchecked() const;
  int64_t unit_bytes() const;
  /// The most stages a checkpointed segment spans: the chain's length (the exact optimum) unless the
  /// table for it would pass the planner's bounds (256 MiB, 10^9 slot updates), then the longest that
  /// stays within them; the plan is then optimal among plans whose segments are no longer.
  int64_t max_segment_stages() const;
  double fill_seconds() const;

 private:
  class Table;  // the dynamic program's table (planner.cpp)
  std::shared_ptr<const Table> table_;
};

}  // namespace remat
