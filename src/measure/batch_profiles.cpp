#include "remat/measure/batch_profiles.h"

#include <algorithm>
#include <optional>

#include "remat/base/error.h"

namespace remat {

std::vector<MeasuredMicroBatch> measure_frontier(const ThroughputChoice& choice, const MeasureMicroBatches& measure) {
  REMAT_CHECK(static_cast<bool>(measure), "measure_frontier: give a function measuring plans at micro-batch sizes.");
  std::vector<MicroBatchRun> runs;
  struct Indices {
    size_t planned;
    std::optional<size_t> unchecked;
  };
  std::vector<std::pair<const MicroBatchChoice*, Indices>> entries;
  for (const MicroBatchChoice& c : choice.frontier) {
    if (!c.planned.feasible) continue;
    Indices at{runs.size(), std::nullopt};
    runs.push_back({c.micro_batch, c.planned.plan});
    if (c.unchecked_fits) {
      // The plan is often the unchecked one itself: then one run answers both.
      Plan plain = c.planned.plan.without_checkpoints();
      const bool same = plain.to_string() == c.planned.plan.to_string();
      at.unchecked = same ? at.planned : runs.size();
      if (!same) runs.push_back({c.micro_batch, std::move(plain)});
    }
    entries.emplace_back(&c, at);
  }
  if (runs.empty()) return {};
  const std::vector<PlanMeasurement> m = measure(runs);
  REMAT_CHECK(m.size() == runs.size(), "measure_frontier: the measure returned ", m.size(), " measurements for ",
              runs.size(), " runs.");
  std::vector<MeasuredMicroBatch> measured;
  for (const auto& [c, at] : entries) {
    MeasuredMicroBatch out;
    out.micro_batch = c->micro_batch;
    out.planned = m[at.planned];
    const double micro = static_cast<double>(c->micro_batch);
    out.samples_per_second = out.planned.step_seconds > 0 ? micro / out.planned.step_seconds : 0.0;
    if (at.unchecked) {
      out.unchecked = m[*at.unchecked];
      out.unchecked_samples_per_second = out.unchecked->step_seconds > 0 ? micro / out.unchecked->step_seconds : 0.0;
    }
    measured.push_back(std::move(out));
  }
  return measured;
}

ProfiledBatches profile_batches(Chain& chain, const std::function<at::Tensor(int64_t batch)>& sample_of_batch,
                                const std::vector<int64_t>& batches, const ProfileOptions& options,
                                CheckpointMode mode) {
  REMAT_CHECK(static_cast<bool>(sample_of_batch),
              "profile_batches: give a function from a batch size to a sample input.");
  REMAT_CHECK(!batches.empty(), "profile_batches: give at least one batch size.");
  ProfiledBatches profiled;
  for (const int64_t b : batches) {
    REMAT_CHECK(b >= 1, "profile_batches: batch sizes must be at least 1, got ", b, ".");
    profiled.tables.emplace_back(b, profile_chain(chain, sample_of_batch(b), options, mode));
  }
  align_step_times(chain, sample_of_batch, profiled, options, mode);
  return profiled;
}

void align_step_times(Chain& chain, const std::function<at::Tensor(int64_t batch)>& sample_of_batch,
                      ProfiledBatches& profiled, const ProfileOptions& options, CheckpointMode mode) {
  REMAT_CHECK(static_cast<bool>(sample_of_batch),
              "align_step_times: give a function from a batch size to a sample input.");
  profiled.time_scales.assign(profiled.tables.size(), 1.0);
  if (profiled.tables.size() < 2) return;
  std::vector<PlanRun> runs;
  for (const auto& [b, table] : profiled.tables) {
    const int64_t batch = b;
    // The sample function may set state of the chain for its size (a loss's targets): run it
    // before every step of that size.
    runs.push_back({&chain, table.unchecked_plan(mode), sample_of_batch(batch),
                    [&sample_of_batch, batch] { sample_of_batch(batch); }});
  }
  const std::vector<PlanMeasurement> measured = measure_runs(runs, std::max(3, options.repeats()));
  for (size_t i = 0; i < profiled.tables.size(); ++i) {
    CostTable& table = profiled.tables[i].second;
    const double predicted = simulate(runs[i].plan, table).step_seconds;
    if (predicted <= 0) continue;
    const double scale = measured[i].step_seconds / predicted;
    profiled.time_scales[i] = scale;
    table.scale_times(scale);
    table.source += ", times aligned across batch sizes";
  }
}

}  // namespace remat
