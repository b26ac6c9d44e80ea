#include "strategies.h"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <optional>

#include "remat/base/error.h"
#include "remat/memory/memory.h"
#include "remat/memory/memory_timeline.h"
#include "remat/models/estimator.h"
#include "remat/models/gpt_policies.h"
#include "remat/internal/table.h"

namespace remat::cli {
namespace {

std::string strip_prefix(const std::string& message) {
  const std::string prefix = "remat: ";
  return message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
}

// One step of `plan` recorded at every allocation and free; the model's gradients must already
// exist (a warm-up step) so the timeline shows a steady-state step.
TimelineSeries trace_step(SampleModel& sample, const Strategy& strategy, uint64_t seed) {
  models::GptChain chain(sample.model, models::gpt_granularity_of(strategy.plan));
  chain.set_targets(sample.targets);
  TimelineSeries series;
  series.name = strategy.name;
  MemoryTimeline timeline;
  const StepMeasurement m = seeded_step(sample, chain, strategy.plan, seed).measurement;
  series.events = timeline.stop();
  series.base_bytes = m.bytes_before_forward;
  series.caption = "peak " + format_bytes(m.activation_peak_bytes()) + ", step " + format_seconds(m.step_seconds);
  return series;
}

std::filesystem::path prepare_out_dir(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  REMAT_CHECK(!error && std::filesystem::is_directory(dir), "--out: cannot create the folder '", dir, "' (",
              error.message(), "); give a writable path.");
  return std::filesystem::path(dir);
}

// The policies that will run: all given ones, or the defaults that apply to this depth.
std::vector<std::string> runnable_policies(const StrategyFlags& flags, int64_t layers) {
  std::vector<std::string> out;
  for (const auto& policy : flags.policies) {
    try {
      models::gpt_policy_plan(policy, layers);
    } catch (const c10::Error&) {
      if (flags.default_policies) continue;
      throw;
    }
    REMAT_CHECK(std::find(out.begin(), out.end(), policy) == out.end(), "--policies lists '", policy, "' twice.");
    out.push_back(policy);
  }
  return out;
}

}  // namespace

std::vector<Strategy> make_strategies(const ModelCosts* costs, int64_t layers, const std::vector<std::string>& policies,
                                      const std::vector<std::string>& budgets, int64_t slots,
                                      const std::vector<CheckpointMode>& modes) {
  std::vector<Strategy> strategies;
  for (const CheckpointMode mode : modes) {
    const std::string suffix = mode == CheckpointMode::reentrant ? "" : std::string(" (") + to_string(mode) + ")";
    for (const auto& policy : policies) {
      Strategy s;
      s.name = policy + suffix;
      s.plan = make_plan(PlanRequest::of_policy(policy).mode(mode), models::gpt_plan_subject(layers)).plan;
      if (s.plan.recompute_depths() == std::vector<int64_t>(s.plan.stage_names.size(), 0) && mode != modes.front()) {
        continue;  // no checkpoint: the same run in every mode
      }
      if (costs != nullptr) s.prediction = costs->predict(s.plan);
      strategies.push_back(std::move(s));
    }
    for (const auto& text : budgets) {
      REMAT_CHECK(costs != nullptr, "planning for a budget needs a profile.");
      Strategy s;
      s.name = "optimal " + text + suffix;
      s.planner = true;
      s.budget_text = text;
      PlanRequest request = PlanRequest::of_budget(Budget::parse(text));
      request.options().planner(PlannerOptions().mode(mode).memory_slots(slots));
      std::optional<PlanResult> planned;
      try {
        planned = make_plan(request, models::gpt_plan_subject(*costs));
      } catch (const c10::Error& e) {
        // The default budgets suit the reference model; on another the planner may find one
        // infeasible: say which flag sets them.
        REMAT_CHECK(false, "--budget ", text, ": ", strip_prefix(e.what_without_backtrace()),
                    " The budgets planned for come from --budget (several: comma-separated; '' for none).");
      }
      const PlanResult& choice = *planned;
      s.budget_bytes = choice.budget_bytes;
      s.plan = choice.plan;
      s.prediction = choice.prediction;
      strategies.push_back(std::move(s));
    }
  }
  return strategies;
}

ModelCosts strategy_costs(const StrategyFlags& flags) {
  const auto& options = flags.model.options;
  if (!flags.planning.profile_file.empty()) {
    return load_profile_for(flags.planning.profile_file, options);
  }
  std::cerr << "profiling the GPT's stages (" << flags.planning.repeats << " interleaved repeats)...\n";
  return profile_model(options, flags.planning.repeats,
                       CheckpointMode::reentrant);  // the reentrant table: both modes' plans are costed on it
}

std::vector<TimelineSeries> trace_strategies(SampleModel& sample, const std::vector<Strategy>& strategies,
                                             const std::vector<std::string>& names, uint64_t seed) {
  std::vector<TimelineSeries> series;
  for (const auto& name : names) {
    for (const auto& s : strategies) {
      if (s.name == name) series.push_back(trace_step(sample, s, seed));
    }
  }
  return series;
}

std::string model_title(const train::TrainOptions& o) {
  const auto& m = o.model;
  return "GPT " + std::to_string(m.layers()) + " layers, hidden " + std::to_string(m.hidden()) + ", " +
         std::to_string(m.heads()) + " heads, seq " + std::to_string(m.sequence()) + ", batch " +
         std::to_string(o.batch) + ", dropout " + fixed(m.dropout(), 2) + ", fp32";
}

CheckedStrategies check_strategy_flags(StrategyFlags& flags) {
  flags.model.apply_preset();
  // The files bench writes in --out: none may be the profile or the text it reads.
  for (const char* written : {"profile.json", "bench.json", "bench.csv", "report.md"}) {
    refuse_output_over_input({{"--profile", flags.planning.profile_file}, {"--data", flags.model.options.data_file}},
                             "--out", (std::filesystem::path(flags.out_dir) / written).string());
  }
  flags.model.options.model.validate();
  CheckedStrategies checked{prepare_out_dir(flags.out_dir),
                            runnable_policies(flags, flags.model.options.model.layers()), budget_list(flags.budgets)};
  REMAT_CHECK(!checked.policies.empty() || !checked.budgets.empty(), "nothing to run: give --policies or --budget.");
  return checked;
}

void add_strategy_flags(CLI::App& command, StrategyFlags& flags, const std::string& budget_help) {
  flags.model.add_to(command, ModelUse::run, "Text file to take the batch from, instead of the fortunes corpus");
  command.add_option("--policies", flags.policies, "Manual policies to run (see `remat policies`), space-separated")
      ->capture_default_str()
      ->group("Planning");
  add_budget_option(command, flags.budgets, budget_help, /*empty_means_none=*/true)->capture_default_str();
  add_checkpoint_mode_option(command, flags.checkpoint_modes,
                             "Run every strategy in each of these checkpoint modes: reentrant, non-reentrant");
  flags.planning.add_to(command);
  command.add_option("--out", flags.out_dir, "Folder for the files written (created if missing)")
      ->capture_default_str()
      ->group("Output");
  command.add_flag("--no-plots", flags.no_plots, "Write data only; do not run gnuplot")->group("Output");
  add_json_flag(command, flags.json);
}

}  // namespace remat::cli
