// Planning for the CLI: profiles of the GPT at both granularities, saved and loaded as one file,
// and every planner's and policy's plan for a budget, predicted by the shared simulator.
#pragma once

#include <string>
#include <vector>

#include "remat/cost_model.h"
#include "remat/memory.h"
#include "remat/planner.h"
#include "remat/models/gpt.h"
#include "remat/train/trainer.h"

namespace remat::cli {

/// The cost table of one model at half-block granularity: plans of both granularities are costed
/// on it (block plans through to_half_granularity), so all predictions share one basis.
struct ModelCosts {
  CostTable half;
  int64_t layers() const { return (static_cast<int64_t>(half.stages.size()) - 2) / 2; }
  Prediction predict(const Plan& plan) const;
  /// Predicted activation peak and time of the unchecked plan.
  Prediction unchecked() const;
  int64_t unchecked_peak_bytes() const { return unchecked().peak_bytes; }
};

/// The GPT of `options` (seeded, in training mode) and one batch of its corpus.
struct SampleModel {
  models::Gpt model{nullptr};
  at::Tensor tokens, targets;
};
SampleModel make_sample_model(const train::TrainOptions& options);

/// One measured training step of `plan` on the sample's batch: gradients zeroed in place (kept
/// allocated, as between training steps), the CPU generator seeded with `seed` so dropout masks
/// repeat, then forward and backward.
struct SeededStep {
  StepMeasurement measurement;
  double loss = 0;
};
SeededStep seeded_step(SampleModel& sample, Chain& chain, const Plan& plan, uint64_t seed);

/// Profiles the GPT of `options` (half-block chain) on a batch of its corpus.
ModelCosts profile_model(const train::TrainOptions& options, int repeats);
void save_profile(const ModelCosts& costs, const std::string& path);
ModelCosts load_profile(const std::string& path);
/// A saved profile, checked to describe the GPT and batch of `options` (its depth, and the bytes of
/// one activation between stages: batch × seq × hidden × 4), with an error naming what differs.
ModelCosts load_profile_for(const std::string& path, const train::TrainOptions& options);

struct PlanChoice {
  std::string name;  ///< a policy name, or "optimal", "revolve", "chen"
  bool feasible = false;
  Plan plan;
  Prediction prediction;
};

/// The optimal plan for `budget` (the DP over the half-block chain).
PlanChoice optimal_plan(const ModelCosts& costs, int64_t budget_bytes, int64_t slots, int64_t* min_feasible_bytes = nullptr);

/// The optimal plan for a budget given as text (parse_budget's forms); throws a clear error naming
/// the least feasible budget when nothing fits.
PlanChoice feasible_optimal_plan(const ModelCosts& costs, const std::string& budget_text, int64_t slots,
                                 int64_t* budget_bytes = nullptr, int64_t* min_feasible_bytes = nullptr);

/// Comma-separated budgets (parse_budget's forms), checked for form and repeats before anything
/// is profiled; empty entries are skipped.
std::vector<std::string> budget_list(const std::string& text);

/// Every manual policy (with and without skip-ends) and the Revolve and Chen planners at `budget`.
std::vector<PlanChoice> other_plans(const ModelCosts& costs, int64_t layers, int64_t budget_bytes, int64_t slots);

/// "1.50 MiB"-style sizes for reports.
std::string format_bytes(int64_t bytes);

}  // namespace remat::cli
