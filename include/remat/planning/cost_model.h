// remat/planning/cost_model.h — what each stage of a chain costs, and the one simulator that turns a plan
// and those costs into a predicted activation peak and step time.
//
// Per stage i (input a(i-1), output a(i)) and per option o (what it keeps inside):
//   forward_seconds       uf: recording forward            backward_seconds  ub
//   nograd_seconds        its forward inside a checkpointed segment, the checkpoint's own work on it
//                         included (recording versions, finding its parameters)
//   recompute_extra_seconds  what the stage costs beyond uf each time a checkpoint's backward
//                         recomputes it (its parameters pass through the checkpoint's node)
//   output_bytes          x: the output a(i); its gradient is the same size
//   kept_bytes            xbar: held after a recording forward, output included, input excluded
//   forward_extra_bytes   of: transient peak of a recording forward above x(i-1) + xbar
//   nograd_extra_bytes    og: transient peak of a no-grad forward above x(i-1) + x
//   backward_extra_bytes  ob: transient peak of backward above a(i-1) + δ(i-1) + abar(i) + δ(i)
//   parameter_bytes       p: gradients of its parameters, held inside a segment until its backward ends
// A stage that ends a recomputed segment runs graph-only (Chain::forward_stage_graph_only): per
// option, `graph_only` holds its forward time, kept bytes (its output not computed) and the rest
// measured that way; where absent (older profiles), the plain values stand in, an overestimate.
// The first stage's input (the batch) and the parameters and their gradients are held before the
// forward: "activation" bytes exclude them. (Rotor's model, Beaumont et al. 2019; docs/planner.md.)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "remat/chain/plan.h"

namespace remat {

/// What one run of a stage with one option costs: a recording forward, then its backward.
struct StageRunCost {
  double forward_seconds = 0, backward_seconds = 0;
  int64_t kept_bytes = 0, forward_extra_bytes = 0, backward_extra_bytes = 0;
};

struct StageOptionCost : StageRunCost {
  std::string option;
  /// The stage run graph-only, as the last stage of a recomputed segment; absent: as plain.
  std::optional<StageRunCost> graph_only;

  StageOptionCost() = default;
  StageOptionCost(std::string name, double forward_s, double backward_s, int64_t kept, int64_t forward_extra,
                  int64_t backward_extra)
      : StageRunCost{forward_s, backward_s, kept, forward_extra, backward_extra}, option(std::move(name)) {}
  /// The costs that apply where the stage ends a recomputed segment.
  const StageRunCost& at_segment_end() const { return graph_only ? *graph_only : *this; }
};

struct StageCost {
  std::string name;
  int64_t output_bytes = 0;
  int64_t input_grad_bytes = 0;  ///< bytes of δ(i-1); 0 for a first stage whose input needs no grad
  /// Bytes of the stage's parameter gradients: a checkpointed segment's backward returns those of
  /// all its stages at once (they are inputs of its autograd node), so they add to its peak.
  int64_t parameter_bytes = 0;
  double nograd_seconds = 0;
  int64_t nograd_extra_bytes = 0;
  std::vector<StageOptionCost> options;  ///< options[0] is the stage's default
  /// The chain's StageInfo::block: the repeated blocks Revolve and Chen's rule plan over; -1 outside
  /// any block. A table where no stage has one (older profiles) counts every stage as a block.
  int64_t block = -1;
  /// Seconds each recompute of the stage takes beyond its recording forward: its parameters are
  /// inputs of the checkpoint's node (found, saved, differentiated and handed back through it),
  /// and the recompute runs inside a backward. Measured in situ by the profiler (a step with the
  /// stage checkpointed by itself); on two CPU cores about 1.5 µs a parameter tensor, which
  /// decides between plans where stages take a tenth of a millisecond. 0 in older tables.
  double recompute_extra_seconds = 0;
  /// How well the profiler pinned the stage's time down: the half-width of an approximate 95%
  /// interval of its default option's forward + backward seconds within a step (its repeats alone
  /// and its in-step rounds, combined); 0 in older tables. The simulator scales it to what a plan
  /// charges the stage (Prediction::step_seconds_spread).
  double spread_seconds = 0;
  /// Measured runs behind its times (the profiler repeats a noisy stage: ProfileOptions::tolerance);
  /// 0 where the table was read from a file or copied from a twin.
  int measured_rounds = 0;

  const StageOptionCost& option(const std::string& name) const;
  /// Whether the table has a cost for the option `name` of this stage.
  bool has_option(const std::string& name) const;
  /// spread_seconds relative to the default option's forward + backward (0 where they are 0).
  double relative_spread() const;
};

/// Costs of a whole chain, with where they came from (measured or estimated).
struct CostTable {
  std::string granularity;
  std::vector<StageCost> stages;
  std::string source;  ///< e.g. "profiled: 3 runs, CPU, 2 threads" or "estimated: fp16"
  /// Bytes each checkpointed segment holds beyond its boundary tensors, from its forward to the
  /// end of its backward (the saved RNG state, about 5 KB per segment on CPU); twice that during
  /// its recompute (the current RNG state is set aside meanwhile).
  int64_t segment_bytes = 0;
  /// Seconds a checkpointed segment adds by itself, whatever it holds: the checkpoint call and
  /// its RNG snapshot in the forward; restoring it and the recompute's own autograd run in the
  /// backward. Measured by the profiler in its mode within a step (stages checkpointed in pairs
  /// against alone), or on a trivial function where the step's noise hides it; the simulator and
  /// the planner charge both once per segment. 0 in tables written before it existed.
  double segment_forward_seconds = 0, segment_backward_seconds = 0;
  double segment_seconds() const { return segment_forward_seconds + segment_backward_seconds; }
  /// The half-width of an approximate 95% interval of segment_seconds(); 0 where unknown.
  double segment_spread_seconds = 0;
  /// The CPU threads the times were measured under (TimingThreads::description, threads.h); empty
  /// in older tables.
  std::string threads;

  /// Stages whose spread_seconds exceeds `tolerance` of their time: the profiler could not pin them
  /// down within its limits (ProfileOptions::tolerance, max_repeats, stage_seconds).
  std::vector<std::string> unstable_stages(double tolerance) const;

  std::string to_json() const;
  static CostTable from_json(const std::string& text, const std::string& source_name = "profile");
  /// One row per stage and option, sizes in MiB, times in ms (llm.c's memory table, with time).
  std::string to_table() const;
  /// Throws a clear error (starting with `who`) unless the table is well formed: at least one
  /// stage, each with at least one option; every size a whole number of bytes from 0 to 2^53 and
  /// all of them together at most 2^53 (so that no simulation or plan of it overflows int64); every
  /// time finite and at least 0; blocks -1 or a block index. The checks CostTable::from_json makes
  /// (it calls this), made on tables built in code: simulate, every planner, interpolate_costs and
  /// validate_against call it.
  void check_well_formed(const std::string& who = "the cost table") const;
  /// Throws unless the table is well formed and has the chain's stages.
  void validate_against(const Chain& chain) const;
  /// The plan that checkpoints nothing, every stage with its default option, in `mode`: the names,
  /// granularity and default options every planner's plans take from the table.
  Plan unchecked_plan(CheckpointMode mode = CheckpointMode::reentrant) const;
  /// Multiplies every time by `factor` (profiles taken at different moments put on one clock).
  void scale_times(double factor);
};

/// What the simulator predicts for a plan.
struct Prediction {
  int64_t peak_bytes = 0;   ///< activation peak, relative to what is held before the forward
  double step_seconds = 0;  ///< forward + backward + recomputes
  int64_t recomputed_stages = 0;
  int64_t segments = 0;  ///< checkpointed segments the plan runs
  /// The half-width of an approximate 95% interval of step_seconds, from the stages' and the
  /// segments' spreads (StageCost::spread_seconds scaled to what the plan charges each stage;
  /// stages independent, segments alike).
  double step_seconds_spread = 0;
  /// Per stage: the seconds the plan charges it (its runs and recomputes) and their spread.
  std::vector<double> stage_seconds, stage_spread_seconds;
  /// segments × CostTable::segment_spread_seconds.
  double segment_spread_seconds = 0;
};

/// `plan`'s predicted step time over `unchecked`'s, minus one (0.05 = 5% slower); 0 where the
/// unchecked step takes no time.
double predicted_overhead(const Prediction& plan, const Prediction& unchecked);

/// The half-width of an approximate 95% interval of `plan`'s predicted overhead over `unchecked`
/// (both simulated on one table): what the plan charges beyond the unchecked step, each stage's
/// part with its relative spread, so that the stages both run alike cancel.
double predicted_overhead_spread(const Prediction& plan, const Prediction& unchecked);

/// The simulator every planner, test and benchmark shares. Plans whose checkpointed segments end
/// at the end of their enclosing range are accepted and costed as written. Throws a clear error,
/// before anything is costed, unless the table is well formed (CostTable::check_well_formed), the
/// plan is too (Plan::check_well_formed) and both have the same number of stages.
Prediction simulate(const Plan& plan, const CostTable& costs);

}  // namespace remat
