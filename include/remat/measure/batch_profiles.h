// remat/measure/batch_profiles.h — a chain profiled at several batch sizes, and the micro-batch
// frontier of a throughput choice (remat/planning/throughput.h) run for real.
//
//   auto sample = [&](int64_t b) { return images.narrow(0, 0, b); };
//   auto profiled = remat::profile_batches(chain, sample, remat::default_profile_batches(16));  // 16, 4, 1
//   remat::ThroughputChoice c = remat::plan_throughput(profiled.costs_at(), 16, "50%");
//   auto measured = remat::measure_frontier(c, measure);  // each micro-batch's plan, interleaved
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "remat/measure/plan_measurement.h"
#include "remat/measure/profiler.h"
#include "remat/planning/throughput.h"

namespace remat {

/// One micro-batch's plan and, where it fits, the unchecked plan, as run.
struct MeasuredMicroBatch {
  int64_t micro_batch = 0;
  PlanMeasurement planned;                   ///< the frontier's plan (absent where none fits)
  std::optional<PlanMeasurement> unchecked;  ///< where checkpointing nothing fits the budget
  double samples_per_second = 0, unchecked_samples_per_second = 0;
};

/// A plan to run at a micro-batch size, for measure_frontier.
struct MicroBatchRun {
  int64_t micro_batch = 0;
  Plan plan;
};
/// Measures every run in one interleaved series (measure_runs, one chain and input per micro-batch):
/// throughputs at different micro-batches are compared, so they must see the same machine.
using MeasureMicroBatches = std::function<std::vector<PlanMeasurement>(const std::vector<MicroBatchRun>& runs)>;

/// Runs the frontier: at each micro-batch, its plan and (where it fits) the unchecked plan, all in
/// one `measure` call. Samples per second are micro-batch / median step; the optimizer's update,
/// once per global batch whatever the micro-batch, is not included.
std::vector<MeasuredMicroBatch> measure_frontier(const ThroughputChoice& choice, const MeasureMicroBatches& measure);

/// Profiles `chain` at each of `batches` on `sample_of_batch(b)` (the chain's loss, if any, must
/// accept outputs of any batch size; the function is called before every run at that size), aligns
/// their times (align_step_times) and answers any batch size with interpolate_costs.
struct ProfiledBatches {
  std::vector<std::pair<int64_t, CostTable>> tables;
  /// What align_step_times multiplied each table's times by (1 where not aligned).
  std::vector<double> time_scales;
  CostTable at(int64_t batch) const { return interpolate_costs(tables, batch); }
  CostsAtBatch costs_at() const {
    return [tables = tables](int64_t batch) { return interpolate_costs(tables, batch); };
  }
};
ProfiledBatches profile_batches(Chain& chain, const std::function<at::Tensor(int64_t batch)>& sample_of_batch,
                                const std::vector<int64_t>& batches, const ProfileOptions& options = {},
                                CheckpointMode mode = CheckpointMode::reentrant);

/// Profiles taken one after another see the machine at different moments (on a shared machine, ten
/// percent apart), and cross-size choices compare them. Each size's unchecked step is measured in one
/// interleaved series (measure_runs, max(3, repeats) rounds; the chain must end in a scalar loss), and each table's times
/// are scaled so that its predicted unchecked step equals that measured step: the profiles keep
/// their proportions within a size and share one clock across sizes.
void align_step_times(Chain& chain, const std::function<at::Tensor(int64_t batch)>& sample_of_batch,
                      ProfiledBatches& profiled, const ProfileOptions& options = {},
                      CheckpointMode mode = CheckpointMode::reentrant);

}  // namespace remat
