// Planning for the GPT: its cost table at half-block granularity (plans of both granularities are
// costed on it, block plans through to_half_granularity, so all predictions share one basis), and
// the library's budget planner and comparisons over the GPT's own policies.
#pragma once

#include <string>
#include <vector>

#include "remat/measure/batch_profiles.h"
#include "remat/measure/plan_measurement.h"
#include "remat/autoplan/make_plan.h"
#include "remat/planning/planner.h"
#include "remat/models/gpt.h"

namespace remat::models {

struct GptCosts {
  CostTable half;
  int64_t layers() const { return (static_cast<int64_t>(half.stages.size()) - 2) / 2; }
  Prediction predict(const Plan& plan) const;
  /// Predicted activation peak and time of the unchecked plan.
  Prediction unchecked() const;
  int64_t unchecked_peak_bytes() const { return unchecked().peak_bytes; }
};

/// Profiles `model` (half-block chain) on one batch, for plans in `mode`.
GptCosts profile_gpt(Gpt model, const at::Tensor& tokens, const at::Tensor& targets,
                     const ProfileOptions& options = PlanningOptions().profile(),
                     CheckpointMode mode = CheckpointMode::reentrant);

/// A cost table's JSON (CostTable::to_json of a half-block GPT profile), checked to be one;
/// `source` names it in errors.
GptCosts gpt_costs_from_json(const std::string& text, const std::string& source);

/// Throws unless `costs` describe a GPT of `config` at batch `batch`: its depth, and the bytes of
/// one activation between stages (batch × sequence × hidden × 4), naming the fields that differ.
void check_gpt_costs(const GptCosts& costs, const GptConfig& config, int64_t batch, const std::string& source);

/// The granularity of the GPT chain a request runs on: its policy's, its plan's (a clear error if
/// it is not a GPT's), or half for a budget (plans are made on the half-block table).
GptGranularity gpt_request_granularity(const PlanRequest& request);

/// What make_plan plans for a GPT of `layers` layers with nothing to run: its own and the generic
/// policies, either granularity (gpt_policy_plan), and plans given.
PlanSubject gpt_plan_subject(int64_t layers);
/// As above, and a budget planned on `costs` alone (estimated or loaded), its prediction trusted.
PlanSubject gpt_plan_subject(const GptCosts& costs);
/// As above, on `model` and one batch: its half-block chain (targets set) profiled, and a budget's
/// plan verified and timed against the nearest rules of thumb on it.
PlanSubject gpt_plan_subject(Gpt model, at::Tensor tokens, at::Tensor targets);

/// Profiles `model` (half-block chain) at each of `batches`, on the first rows of `tokens` and
/// `targets`, for plan_throughput (remat/planning/throughput.h).
ProfiledBatches profile_gpt_batches(Gpt model, const at::Tensor& tokens, const at::Tensor& targets,
                                    const std::vector<int64_t>& batches,
                                    const ProfileOptions& options = PlanningOptions().profile(),
                                    CheckpointMode mode = CheckpointMode::reentrant);

/// The GPT's policies worth comparing, generic and its own, without ",skip-ends" (the one list:
/// planners' comparisons and `remat bench`'s defaults derive from it).
std::vector<std::string> gpt_policy_names();

/// Every GPT policy compare_planners tries: gpt_policy_names() with and without ",skip-ends".
std::vector<std::string> gpt_policy_candidates();

/// Those policies, Revolve and Chen at `budget`, all costed on the half-block table.
std::vector<PlanResult> gpt_compare_planners(const GptCosts& costs, const Budget& budget,
                                             const PlannerOptions& options = {});

/// remat::measure_plans for GPT plans of either granularity on one batch, interleaved; the model is
/// not updated.
std::vector<PlanMeasurement> gpt_measure_plans(Gpt model, const std::vector<Plan>& plans, const at::Tensor& tokens,
                                               const at::Tensor& targets, int steps,
                                               const MeasureProgress& progress = {});

/// For measure_frontier: each run on the first `micro_batch` rows of `tokens` and `targets`, all
/// interleaved; the model is not updated.
std::vector<PlanMeasurement> gpt_measure_micro_batches(Gpt model, const std::vector<MicroBatchRun>& runs,
                                                       const at::Tensor& tokens, const at::Tensor& targets, int steps,
                                                       const MeasureProgress& progress = {});

}  // namespace remat::models
