// remat/measure/profiler.h — measuring a chain's cost table on a sample batch.
//
//   remat::CostTable costs = remat::profile_chain(chain, tokens);
//   std::cout << costs.to_table();
//
// Every stage runs with each of its options on its real input, timed within whole steps, its
// bytes exact; the model is left as it was. What is measured and how: docs/planner.md, "The
// profiler".
#pragma once

#include <torch/arg.h>

#include "remat/chain/chain.h"
#include "remat/checkpoint/checkpoint.h"
#include "remat/planning/cost_model.h"
#include "remat/base/threads.h"

namespace remat {

struct ProfileOptions {
  /// The fewest measured runs per stage and option, and the fewest in-step rounds; times are medians.
  TORCH_ARG(int, repeats) = 3;
  /// A stage is run again (round after round, all its options) until its forward + backward is
  /// pinned down to within this fraction (the half-width of a ~95% interval of the median), ...
  TORCH_ARG(double, tolerance) = 0.05;
  /// ... or it has this many measured runs (or `repeats`, where that is more), ...
  TORCH_ARG(int, max_repeats) = 15;
  /// ... or its runs beyond `repeats` have taken this many seconds. A stage still unstable is
  /// named in CostTable::source, and its spread (StageCost::spread_seconds) widens what the plans
  /// running it predict.
  TORCH_ARG(double, stage_seconds) = 1.0;
  /// The rounds of whole steps (plain, stages checkpointed alone and in pairs) go on past the
  /// fewest while what checkpointing adds to the step scatters more than half the tolerance, up to
  /// 41 rounds or this many seconds of them.
  TORCH_ARG(double, in_step_seconds) = 4.0;
  /// Oversubscribed CPU threads are rearranged while profiling and put back after (threads.h).
  TORCH_ARG(ThreadsWhileTiming, threads) = ThreadsWhileTiming::arranged;
  /// Unmeasured runs first (allocations, caches).
  TORCH_ARG(int, warmup) = 1;
  /// Also measure the generic option "sac" (kSacOption, chain.h) on every stage that does not
  /// list it, so the planner can choose it: selective checkpointing inside the stage.
  TORCH_ARG(bool, sac_option) = false;
};

/// `mode` is the checkpoint mode the plans will run in, which the segment-end ("graph-only") costs
/// are for. Reentrant: the stage's Chain::forward_stage_graph_only. Non-reentrant: the generic early
/// stop, measured for any chain as the stage's forward stopped at its last saved tensor (the
/// backward is the plain one's).
CostTable profile_chain(Chain& chain, const at::Tensor& input, const ProfileOptions& options = {},
                        CheckpointMode mode = CheckpointMode::reentrant);

}  // namespace remat
