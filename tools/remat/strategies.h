// What `remat bench` and `remat trace` share: the strategies they run (manual policies and the
// optimal plan at budgets), the flags that choose them, and one traced step of each.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "model_flags.h"
#include "planning.h"
#include "plots.h"

namespace remat::cli {

struct StrategyFlags {
  ModelFlags model;
  std::vector<std::string> policies;
  std::vector<std::string> budgets;
  PlanningFlags planning;
  std::string out_dir;
  bool no_plots = false;
  bool json = false;
  bool default_policies = true;  ///< --policies not given: drop the defaults that do not apply to this depth
  std::vector<CheckpointMode> checkpoint_modes = {CheckpointMode::reentrant};  ///< each strategy runs in each
};

struct Strategy {
  std::string name;
  bool planner = false;
  std::string budget_text;  ///< planner strategies: the budget as given
  int64_t budget_bytes = 0;
  Plan plan;
  std::optional<Prediction> prediction;
};

/// Registers the model flags, --policies, --budget, --profile, --repeats, --slots, --out,
/// --no-plots and --json; the callback must set `default_policies`.
void add_strategy_flags(CLI::App& command, StrategyFlags& flags, const std::string& budget_help);

/// What bench and trace check before profiling or measuring anything: the model, the output
/// folder, the policies that apply and the budgets' form.
struct CheckedStrategies {
  std::filesystem::path out;
  std::vector<std::string> policies, budgets;
};
CheckedStrategies check_strategy_flags(StrategyFlags& flags);

/// The profile of the flags' model: from --profile, or measured.
ModelCosts strategy_costs(const StrategyFlags& flags);

/// The policies' plans, then the optimal plan per budget (`costs` needed only with budgets), in
/// each mode; a non-reentrant strategy's name ends " (non-reentrant)", and a plan without
/// checkpoints runs once.
std::vector<Strategy> make_strategies(const ModelCosts* costs, int64_t layers, const std::vector<std::string>& policies,
                                      const std::vector<std::string>& budgets, int64_t slots,
                                      const std::vector<CheckpointMode>& modes = {CheckpointMode::reentrant});

/// One step of each named strategy recorded at every allocation and free.
std::vector<TimelineSeries> trace_strategies(SampleModel& sample, const std::vector<Strategy>& strategies,
                                             const std::vector<std::string>& names, uint64_t seed);

/// "GPT 8 layers, hidden 256, ..., fp32": the model of a report's title.
std::string model_title(const train::TrainOptions& options);

}  // namespace remat::cli
