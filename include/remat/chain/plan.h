// remat/chain/plan.h — what to keep and what to recompute, for one chain.
//
// A plan is a sequence of items covering the chain's stages in order: an item either runs one
// stage normally or checkpoints a segment, which is itself a sequence of items (its inner plan,
// used when the segment is recomputed). Each stage also has an option saying what it keeps inside.
// Compact form, with stage names, options other than the stage's default after a colon and
// checkpointed segments in brackets:
//
//   stem [layer0 layer1] [layer2 [layer3]] layer4:lean loss
//
// Plans serialise to JSON and load with validation against the chain they are meant for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "remat/chain/chain.h"
#include "remat/checkpoint/checkpoint.h"

namespace remat {

struct PlanItem {
  int64_t stage = -1;             ///< >= 0: run this stage; -1: checkpoint `segment`
  std::vector<PlanItem> segment;  ///< the checkpointed segment's inner plan

  static PlanItem run(int64_t stage) { return PlanItem{stage, {}}; }
  static PlanItem checkpointed(std::vector<PlanItem> items) { return PlanItem{-1, std::move(items)}; }
  bool is_stage() const { return stage >= 0; }
};

/// The first and last stage that `items` run (-1, -1 when they run none).
std::pair<int64_t, int64_t> stage_range(const std::vector<PlanItem>& items);

struct Plan {
  std::string granularity;               ///< the chain's (Chain::granularity)
  std::vector<std::string> stage_names;  ///< the chain's stage names, in order
  std::vector<PlanItem> items;
  std::vector<std::string> options;  ///< one per stage
  /// Each stage's default option (the chain's options[0]), which the compact form leaves out;
  /// empty when unknown (a plan file that does not record them), and then every option is shown.
  std::vector<std::string> default_options;
  /// How its segments are checkpointed. Non-reentrant segments hold no parameter gradients in
  /// their backward (the simulator and the planner count that) and stop their recompute early by
  /// themselves, for any chain.
  CheckpointMode mode = CheckpointMode::reentrant;

  /// The unchecked plan, which checkpoints nothing (the policy "none"): every stage run normally with
  /// its default option. The one builder of it; the overload below, CostTable::unchecked_plan and
  /// without_checkpoints call it.
  static Plan unchecked(std::string granularity, std::vector<std::string> stage_names,
                        std::vector<std::string> default_options, CheckpointMode mode = CheckpointMode::reentrant);
  /// Every stage of `chain` run normally with its default option.
  static Plan unchecked(const Chain& chain);
  /// This plan's stages, granularity, mode and default options, nothing checkpointed.
  Plan without_checkpoints() const;

  /// The compact form (see the top of this header).
  std::string to_string() const;
  std::string to_json() const;
  /// Parses and checks a plan's JSON; `source` names it in errors (a file name). With
  /// `max_stages` (the most stages the model's chains have), a file listing more is refused while
  /// it is read, before anything is built per stage: a million names for a model of six, at once.
  static Plan from_json(const std::string& text, const std::string& source = "plan", int64_t max_stages = -1);

  /// Throws a clear error (starting with `who`) unless the plan is well formed by itself: at least
  /// one stage, one option per stage (and default options none or one per stage), items that run
  /// every stage once, in order, by an index below the number of stages, no empty segment, nesting
  /// within check_nesting's bound. The checks Plan::from_json makes (it calls this), made on plans
  /// built in code: simulate, run_plan and validate_against call it.
  void check_well_formed(const std::string& who = "the plan") const;
  /// Throws a clear error unless the plan is well formed and made for `chain`.
  void validate_against(const Chain& chain) const;
  /// Checks the plan against `chain` (validate_against) and records the chain's default options.
  void bind_to(const Chain& chain);

  /// How many checkpointed segments enclose each stage (its recompute count per step).
  std::vector<int64_t> recompute_depths() const;

  /// The deepest nesting of checkpointed segments accepted: deeper than the number of stages is
  /// meaningless (each level needs a stage of its own to differ), and plans are walked
  /// recursively level by level, so the bound also keeps the stack small.
  static constexpr int64_t kMaxNesting = 256;
  /// Throws a clear error (naming `who`) when segments nest deeper than min(stages, kMaxNesting).
  /// Iterative: safe on any plan.
  void check_nesting(const std::string& who) const;
};

/// Runs `chain` under `plan` on `input` (the model's input); returns the last stage's output.
/// Checkpointed segments restore their stages' buffers (Chain::stage_buffers) after each
/// recompute, so running statistics update once per step under every plan. Their recomputes run
/// in backward and call `chain`: it must outlive the backward (a recompute that finds it destroyed
/// throws, naming the segment); the shared_ptr form holds it until then itself.
at::Tensor run_plan(Chain& chain, const Plan& plan, const at::Tensor& input);
at::Tensor run_plan(std::shared_ptr<Chain> chain, const Plan& plan, const at::Tensor& input);

/// What run_plan_observed calls around each top-level item of a plan (item k of Plan::items).
struct PlanItemObserver {
  std::function<void(size_t k)> before;                           ///< just before item k's forward
  std::function<void(size_t k, const at::Tensor& output)> after;  ///< just after it, with its output
};

/// run_plan, with `observer` called around each top-level item: for code that times or hooks a
/// plan item by item (the profiler's in-step pass). The same result and gradients as run_plan.
at::Tensor run_plan_observed(Chain& chain, const Plan& plan, const at::Tensor& input, const PlanItemObserver& observer);

}  // namespace remat
