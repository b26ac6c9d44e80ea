// remat/planning/profiler.h — measuring a chain's cost table on a sample batch.
//
//   remat::CostTable costs = remat::profile_chain(chain, tokens);
//   std::cout << costs.to_table();
//
// Each stage runs on its real input (the previous stages' output) with each of its options: a
// recording forward and a backward, both again graph-only (as the last stage of a recomputed
// segment runs: Chain::forward_stage_graph_only, or for non-reentrant plans the forward stopped at
// its last saved tensor), and a forward as a checkpointed segment runs it
// (graph recorded, saved tensors dropped). Bytes are exact (the CPU memory tracker, or CUDA allocator statistics);
// times are medians of at least `repeats` runs after `warmup` runs, more for a stage whose
// runs scatter (ProfileOptions::tolerance), and each stage's spread is kept (StageCost::spread_seconds). Parameter gradients are allocated by
// the warm-up, as they are in training after the first step. Gradients, buffers and RNG streams are
// restored afterwards: profiling leaves the model as it was. Stages with one signature
// (Chain::stage_signature) and the same sizes get one time, the median of theirs (gradients that exist are copied aside
// meanwhile, their bytes held twice; none are when profiling before the first step); only the first
// four twins of a signature and input shape are measured, the others take their costs, so a deep
// stack of identical layers profiles in the time of a few.
//
// Times are then scaled to what each stage takes within a whole step (the chain run whole, its
// backward timed stage by stage with hooks on the boundaries): timed alone, a stage pays per call
// what a step pays once, which at a tenth of a millisecond a stage is most of its time. The same
// rounds run the chain with every stage but the last checkpointed alone and in pairs, as run_plan
// runs them: a stage's forward there is its nograd_seconds, what its recompute adds beyond its
// forward its recompute_extra_seconds, and a pair against its two singles gives what a segment
// costs by itself (CostTable::segment_forward_seconds, segment_backward_seconds), where the rounds
// pin that down; elsewhere a checkpoint of a trivial function against the function run plainly
// stands in. Short steps get up to about a second of rounds (docs/planner.md). Oversubscribed CPU
// threads are rearranged while it times and put back (threads.h; CostTable::threads says how).
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
  /// The checkpoint mode the segment-end ("graph-only") costs are for. Reentrant: the stage's
  /// Chain::forward_stage_graph_only. Non-reentrant: the generic early stop, measured for any chain
  /// as the stage's forward stopped at its last saved tensor (the backward is the plain one's).
  TORCH_ARG(CheckpointMode, mode) = CheckpointMode::reentrant;
  /// Also measure the generic option "sac" (kSelectiveOption, chain.h) on every stage that does not
  /// list it, so the planner can choose it: selective checkpointing inside the stage.
  TORCH_ARG(bool, selective_option) = false;
};

CostTable profile_chain(Chain& chain, const at::Tensor& input, const ProfileOptions& options = {});

}  // namespace remat
