// `remat trace`: the memory timeline alone, for chosen strategies: activation bytes at every
// allocation and free over one steady-state training step, plotted per strategy.
#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "remat/base/error.h"
#include "remat/memory/memory.h"
#include "remat/memory/memory_timeline.h"
#include "strategies.h"
#include "remat/internal/table.h"

namespace remat::cli {
namespace {

void run_trace(StrategyFlags& flags) {
  const auto [out, policies, budgets] = check_strategy_flags(flags);
  REMAT_CHECK(!budgets.empty() || flags.planning.profile_file.empty(),
              "--profile has no effect without --budget: `remat trace` ",
              "plans from a profile only for the budgets' optimal plans. Drop --profile, or give --budget.");
  const auto& options = flags.model.options;
  std::ostream& human = human_output(flags.json);
  std::optional<ModelCosts> costs;
  if (!budgets.empty()) costs = strategy_costs(flags);
  const auto strategies = make_strategies(costs ? &*costs : nullptr, options.model.layers(), policies, budgets,
                                          flags.planning.slots, flags.checkpoint_modes);
  install_cpu_memory_tracker();
  SampleModel sample = make_sample_model(options);
  std::cerr << "warming up " << strategies.size() << " strategies...\n";
  std::vector<std::string> names;
  for (const auto& s : strategies) names.push_back(s.name);
  trace_strategies(sample, strategies, names, options.seed);  // allocates the gradients
  const auto timelines = trace_strategies(sample, strategies, names, options.seed);
  Table table({{"strategy", "strategy"},
               {"events", "events"},
               {"activation_peak_bytes", "activation peak"},
               {"step_seconds", "step"}});
  for (const auto& t : timelines) {
    int64_t peak = 0;
    for (const auto& e : t.events) peak = std::max(peak, e.bytes - t.base_bytes);
    const double seconds = t.events.empty() ? 0.0 : t.events.back().seconds;
    table.add_row({t.name,
                   {std::to_string(t.events.size()), t.events.size()},
                   {format_bytes(peak), peak},
                   {format_seconds(seconds), seconds}});
  }
  table.print(human);
  std::vector<std::string> files;
  if (flags.no_plots) {
    for (const auto& t : timelines) {
      files.push_back((out / ("timeline-" + std::to_string(files.size()) + ".csv")).string());
      write_memory_events_csv(t.events, files.back());
    }
  } else {
    files = plot_timeline(out.string(), "Activation memory over one training step: " + model_title(options), timelines);
  }
  human << "wrote:";
  for (const auto& f : files) human << " " << f;
  human << "\n";
  if (flags.json) std::cout << nlohmann::json{{"strategies", table.json()}, {"files", files}}.dump(2) << "\n";
}

}  // namespace

void add_trace_command(CLI::App& app) {
  auto flags = std::make_shared<StrategyFlags>();
  flags->policies = {"none", "block", "core-attn"};
  flags->out_dir = "remat-trace";
  CLI::App* trace = app.add_subcommand(
      "trace", "Record and plot activation bytes over one training step (every allocation and free), per strategy");
  add_strategy_flags(*trace, *flags, "Also trace the optimal plan for each of these activation budgets");
  trace->callback([flags, trace] {
    flags->default_policies = trace->get_option("--policies")->count() == 0;
    run_trace(*flags);
  });
}

}  // namespace remat::cli
