// remat/planning/throughput.h — the most samples per second under a memory budget: the micro-batch is
// chosen with the plan, gradient accumulation making up the global batch. It answers "when
// checkpointing costs too much, lower the batch or accept slower training?" from cost tables at
// several batch sizes (profiled by remat/measure/batch_profiles.h, which also runs the frontier).
//
//   auto profiled = remat::profile_batches(chain, sample, remat::default_profile_batches(16));  // measure/
//   remat::ThroughputChoice c = remat::plan_throughput(profiled.costs_at(), /*global_batch=*/16, "50%");
//   const remat::MicroBatchChoice& best = c.chosen();   // e.g. micro-batch 8 × 2 steps, its plan
//   std::cout << best.micro_batch << " x " << best.accumulation << ": " << best.planned.plan.to_string() << "\n";
//
// Cost tables at batch sizes the profile did not run at are interpolated from those it did
// (interpolate_costs): bytes and times each linear between the two profiled sizes around the batch.
// Activation bytes are linear in the batch; times are affine only piecewise (per-sample cost falls
// while per-operation overheads are amortised, and rises again as activations outgrow the caches),
// so the default profile spans every micro-batch searched (G, the divisor nearest √G, 1) and
// check_interpolation measures the law on the interior profiled size. Micro-batches are
// divisors of the global batch, so that the mean of the micro-batches' losses is the global
// batch's and the accumulated gradients equal its gradients.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include <torch/arg.h>

#include "remat/planning/budget.h"
#include "remat/planning/planner.h"

namespace remat {

/// A chain's cost table at any batch size.
using CostsAtBatch = std::function<CostTable(int64_t batch)>;

struct ThroughputOptions {
  /// The checkpoint mode and memory grid of every plan.
  TORCH_ARG(PlannerOptions, planner) = {};
  /// The micro-batches to consider (each a divisor of the global batch); empty: every divisor.
  TORCH_ARG(std::vector<int64_t>, micro_batches) = {};
};

/// One micro-batch size under the budget.
struct MicroBatchChoice {
  int64_t micro_batch = 0;
  int64_t accumulation = 0;  ///< micro-batches per global batch
  /// The fastest plan predicted to fit at this micro-batch; `feasible` false where none does.
  PlanResult planned;
  /// global batch / (accumulation × predicted step): 0 where no plan fits.
  double predicted_samples_per_second = 0;
  /// Whether checkpointing nothing fits at this micro-batch, and its throughput then (else 0).
  bool unchecked_fits = false;
  double unchecked_samples_per_second = 0;
};

/// The frontier of micro-batch sizes under one budget, the choice, and the two baselines a user would
/// otherwise pick.
struct ThroughputChoice {
  int64_t global_batch = 0;
  int64_t budget_bytes = 0;
  /// Unchecked activation peak at the global batch (what a share of the budget is of).
  int64_t unchecked_peak_bytes = 0;
  std::vector<MicroBatchChoice> frontier;  ///< one per micro-batch, ascending
  /// The highest predicted throughput over the frontier (empty when nothing fits).
  std::optional<size_t> best;
  /// Baseline: the largest micro-batch that fits with no checkpointing at all.
  std::optional<size_t> largest_unchecked;
  /// Baseline: the global batch in one step with its optimal plan (when one fits).
  std::optional<size_t> whole_batch;

  /// The best choice; throws a clear error naming the least budget that fits when nothing does.
  const MicroBatchChoice& chosen() const;
};

/// The micro-batch and plan with the highest predicted samples per second under `budget` (a share
/// is of the unchecked peak at the global batch).
ThroughputChoice plan_throughput(const CostsAtBatch& costs_at, int64_t global_batch, const Budget& budget,
                                 const ThroughputOptions& options = {});

/// A cost table at `batch` from tables of one chain profiled at other batch sizes (two or more,
/// distinct): each byte and time figure linear between the two profiled sizes around `batch` (beyond
/// them, along the nearest two; bytes rounded up, nothing below zero). Profiled sizes return their
/// own table.
CostTable interpolate_costs(const std::vector<std::pair<int64_t, CostTable>>& profiled, int64_t batch);

/// How well the linear law holds on a profile: each interior profiled size predicted from its
/// neighbours, its unchecked peak and step compared with its own table's (relative errors, the largest).
struct InterpolationCheck {
  double peak_error = 0, step_error = 0;
  int64_t worst_batch = 0;  ///< the size the larger error was found at; 0 when there are no interior sizes
};
InterpolationCheck check_interpolation(const std::vector<std::pair<int64_t, CostTable>>& profiled);

/// The batch sizes worth profiling for a global batch G: G, the divisor of G nearest √G, and 1
/// (distinct ones): the ends of the micro-batches plan_throughput searches, and one between.
std::vector<int64_t> default_profile_batches(int64_t global_batch);

}  // namespace remat
