// `remat bench`: where each strategy stands on the memory/time curve, measured in one run. Every
// manual policy and the optimal plan at each budget run the same batch on the same model in
// interleaved rounds; the report has a table (with the cost model's predictions beside the
// measurements), CSV, JSON, a Pareto plot, a memory timeline and a Markdown summary, all rendered
// from one set of rows.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <iostream>
#include <memory>

#include <ATen/ops/zeros_like.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include "commands.h"
#include "invocation.h"
#include "progress.h"
#include "remat/cpu_threads.h"
#include "remat/error.h"
#include "remat/files.h"
#include "remat/memory.h"
#include "remat/models/estimator.h"
#include "remat/models/gpt_planning.h"
#include "remat/plan_measurement.h"
#include "strategies.h"
#include "table.h"

namespace remat::cli {
namespace {

struct BenchFlags : StrategyFlags {
  int steps = 3;
  std::vector<std::string> trace;  ///< strategy names; empty: the defaults
  bool no_trace = false;
};

// The strategies whose timeline to record, checked against what will run (policies that apply to
// this depth, and "optimal <budget>") before anything is profiled or measured.
std::vector<std::string> traced_names(const BenchFlags& flags, const std::vector<std::string>& policies,
                                      const std::vector<std::string>& budgets) {
  if (flags.no_trace) return {};
  std::vector<std::string> known = policies;
  for (const auto& b : budgets) known.push_back("optimal " + b);
  auto is_known = [&](const std::string& name) { return std::find(known.begin(), known.end(), name) != known.end(); };
  std::vector<std::string> names = flags.trace;
  if (names.empty()) {  // the extremes and the planner's middle budget
    for (const std::string wanted : {"none", "block"}) {
      if (is_known(wanted)) names.push_back(wanted);
    }
    if (!budgets.empty()) names.push_back("optimal " + budgets[budgets.size() / 2]);
  }
  for (const auto& name : names) {
    REMAT_CHECK(is_known(name), "--trace: '", name,
                "' is not one of the strategies measured (a --policies entry, or 'optimal <budget>').");
  }
  return names;
}

void run_bench(BenchFlags& flags) {
  const auto [out, policies, budgets] = check_strategy_flags(flags);
  const auto& options = flags.model.options;
  std::ostream& human = human_output(flags.json);
  const std::vector<std::string> trace_names = traced_names(flags, policies, budgets);
  const ModelCosts costs = strategy_costs(flags);
  const std::vector<Strategy> strategies = make_strategies(&costs, options.model.layers, policies, budgets, flags.slots, flags.checkpoint_modes);
  install_cpu_memory_tracker();
  SampleModel sample = make_sample_model(options);
  const std::string threads = set_cpu_threads(options.threads);

  // The unchecked plan is the reference for "saved" and "overhead": measure it even if not listed.
  std::vector<Plan> plans;
  for (const auto& s : strategies) plans.push_back(s.plan);
  const auto none_it = std::find_if(strategies.begin(), strategies.end(), [](const Strategy& s) { return s.name == "none"; });
  const bool none_listed = none_it != strategies.end();
  const size_t none_index = none_listed ? static_cast<size_t>(none_it - strategies.begin()) : plans.size();
  if (!none_listed) plans.push_back(Plan::plain(models::GptChainShape(options.model.layers, "block")));

  std::cerr << "measuring " << plans.size() << " strategies: one warm-up round, then " << flags.steps
            << " interleaved rounds (" << model_title(options) << ")\n";
  std::vector<PlanMeasurement> measured;
  {
    Progress progress("round", flags.steps + 1, flags.steps + 1);
    const auto started = std::chrono::steady_clock::now();
    measured = train::measure_plans(sample.model, plans, sample.tokens, sample.targets, flags.steps,
                                    [&](int round, int rounds, size_t p) {
                                      if (p != 0) return;
                                      const double elapsed =
                                          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
                                      progress.update(round + 1, std::string(round == 0 ? "warm-up" : "measured") + ", " +
                                                                     fixed(elapsed, 0) + " s so far");
                                      (void)rounds;
                                    });
  }
  const PlanMeasurement& none = measured[none_index];

  std::vector<ParetoPoint> points;
  for (size_t i = 0; i < strategies.size(); ++i) {
    points.push_back({strategies[i].name, strategies[i].planner, mebibytes(measured[i].activation_peak_bytes),
                      measured[i].step_seconds, false});
  }
  mark_pareto_frontier(points);

  // One row per strategy, rendered to the terminal, CSV, JSON and Markdown.
  Table rows({{"strategy", "strategy"}, Column::data("kind"), Column::data("budget"), Column::data("budget_bytes"),
              Column::data("plan"), Column::data("granularity"), {"activation_peak_bytes", "activation peak"},
              {"saved_fraction", "saved"}, {"median_step_seconds", "median step"}, {"overhead_fraction", "overhead"}, {"predicted_peak_bytes", "predicted peak"},
              {"peak_error_fraction", "peak error"}, {"predicted_overhead_fraction", "predicted overhead"},
              Column::data("within_budget"), {"on_pareto_frontier", "Pareto"}});
  const double predicted_none = costs.unchecked().step_seconds;
  const nlohmann::json none_value;
  for (size_t i = 0; i < strategies.size(); ++i) {
    const Strategy& s = strategies[i];
    const PlanMeasurement& m = measured[i];
    const double saved = 1.0 - static_cast<double>(m.activation_peak_bytes) / static_cast<double>(none.activation_peak_bytes);
    const double overhead = paired_time_ratio(m, none) - 1.0;  // per round: drift cancels
    const bool over = s.planner && m.activation_peak_bytes > s.budget_bytes;
    Cell predicted_peak("-", none_value), peak_error("-", none_value), predicted_overhead("-", none_value);
    if (s.prediction) {
      const double error = static_cast<double>(s.prediction->peak_bytes - m.activation_peak_bytes) /
                           static_cast<double>(std::max<int64_t>(m.activation_peak_bytes, 1));
      const double fraction = s.prediction->step_seconds / predicted_none - 1.0;
      predicted_peak = Cell(format_bytes(s.prediction->peak_bytes), s.prediction->peak_bytes);
      peak_error = Cell(percent(error), error);
      predicted_overhead = Cell(percent(fraction), fraction);
    }
    rows.add_row({s.name, s.planner ? "planner" : "policy", Cell(s.budget_text, s.planner ? nlohmann::json(s.budget_text) : none_value),
                  Cell("", s.planner ? nlohmann::json(s.budget_bytes) : none_value), s.plan.to_string(), s.plan.granularity,
                  Cell(format_bytes(m.activation_peak_bytes) + (over ? " OVER" : ""), m.activation_peak_bytes),
                  Cell(fixed(100.0 * saved, 1) + "%", saved), Cell(format_seconds(m.step_seconds), m.step_seconds),
                  Cell(percent(overhead), overhead), predicted_peak, peak_error,
                  predicted_overhead, Cell("", s.planner ? nlohmann::json(!over) : none_value),
                  Cell(points[i].on_frontier ? "*" : "", points[i].on_frontier)});
  }
  const std::string title = model_title(options);
  human << "\n" << title << "; median of " << flags.steps << " interleaved steps (overheads paired per round), exact activation bytes\n";
  rows.print(human);
  human << "(* on the Pareto frontier: no other strategy is both smaller and faster)\n";

  // Timelines after the table.
  std::vector<TimelineSeries> timelines;
  if (!trace_names.empty()) {
    std::cerr << "recording the memory timeline of " << trace_names.size() << " strategies...\n";
    // measure_plans leaves the model as it found it, gradients unallocated: trace a steady-state
    // step, with them allocated as after a first training step.
    for (auto& p : sample.model->parameters()) {
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    }
    timelines = trace_strategies(sample, strategies, trace_names, options.seed);
  }

  std::vector<std::string> files = {(out / "bench.csv").string(), (out / "bench.json").string(),
                                    (out / "profile.json").string()};
  write_file_atomically(files[0], rows.csv());
  save_profile(costs, files[2]);  // `remat plan --profile` on it gives the same plans again
  if (!flags.no_plots) {
    std::vector<PlotMarker> budget_markers;
    for (const auto& s : strategies) {
      if (s.planner) budget_markers.push_back({"budget " + s.budget_text, mebibytes(s.budget_bytes)});
    }
    for (const auto& f : plot_pareto(out.string(), "remat bench: " + title, points, budget_markers)) files.push_back(f);
    if (!timelines.empty()) {
      for (const auto& f : plot_timeline(out.string(), "Activation memory over one training step: " + title, timelines))
        files.push_back(f);
    }
  }

  // The Markdown report.
  std::string md;
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  md += "# remat bench: " + title + "\n\nMeasured " + date + " with LibTorch " + TORCH_VERSION + " on " + threads +
        ".\n\n    " + invocation() + "\n\n" +
        "Every strategy runs forward + backward on the same batch and model; one warm-up round, then " +
        std::to_string(flags.steps) +
        " rounds in which every strategy takes one step in turn (interleaved, so machine drift hits all alike). "
        "Activation peak: the most bytes held above parameters, gradients and batch during the step, counted "
        "exactly by remat's tracking allocator (largest over the rounds). Step time: the median; overhead: the median "
        "over rounds of the step's ratio to the unchecked step of the same round. "
        "Predictions come from the profiled cost model that the planner optimises, saved as `profile.json` "
        "(`remat plan --profile profile.json --budget 30%` plans again from it).\n\n" +
        rows.markdown() + "\nPlans (compact form: `[...]` is a checkpointed segment, `:option` what a stage keeps):\n\n";
  for (const auto& s : strategies) md += "- " + s.name + ": `" + s.plan.to_string() + "`\n";
  if (gnuplot_available() && !flags.no_plots) {
    md += "\n![activation peak vs step time](pareto.png)\n";
    if (!timelines.empty()) md += "\n![memory timeline](timeline.png)\n";
  }
  files.push_back((out / "report.md").string());
  write_file_atomically(files.back(), md);

  nlohmann::json report = {{"command", invocation()},
                           {"model", {{"layers", options.model.layers}, {"hidden", options.model.hidden},
                                      {"heads", options.model.heads}, {"sequence", options.model.sequence},
                                      {"dropout", options.model.dropout}, {"batch", options.batch}}},
                           {"threads", threads},
                           {"torch_version", TORCH_VERSION},
                           {"steps", flags.steps},
                           {"unchecked_activation_peak_bytes", none.activation_peak_bytes},
                           {"unchecked_median_step_seconds", none.step_seconds},
                           {"strategies", rows.json()}};
  nlohmann::json all_steps = nlohmann::json::object();  // every measured step, for other statistics
  for (size_t i = 0; i < strategies.size(); ++i) all_steps[strategies[i].name] = measured[i].all_step_seconds;
  report["step_seconds"] = all_steps;
  write_file_atomically(files[1], report.dump(2) + "\n");
  human << "\nwrote:";
  for (const auto& f : files) human << " " << f;
  human << "\n";
  report["files"] = files;
  if (flags.json) std::cout << report.dump(2) << "\n";
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto flags = std::make_shared<BenchFlags>();
  flags->policies = {"none"};
  for (const auto& p : models::gpt_policy_names()) flags->policies.push_back(p);
  flags->policies.push_back("block,skip-ends");
  flags->budgets = {"30%", "50%", "70%"};
  flags->out_dir = "remat-bench";
  CLI::App* bench = app.add_subcommand(
      "bench", "Measure every policy and the planner at budgets, interleaved: table, CSV, JSON, Pareto plot, memory timeline, report");
  add_strategy_flags(*bench, *flags, "Also run the optimal plan for each of these activation budgets ('' for none)");
  add_measure_steps_option(*bench, flags->steps, "Measured rounds after one warm-up round (each strategy one step per round)");
  add_old_spelling(*bench, "--steps", "--measure-steps", flags->steps);
  bench->add_option("--trace", flags->trace, "Strategies whose memory timeline to plot (default: none, block, the middle budget's optimal plan)")
      ->group("Output");
  bench->add_flag("--no-trace", flags->no_trace, "Skip the memory timeline")->group("Output");
  bench->callback([flags, bench] {
    flags->default_policies = bench->get_option("--policies")->count() == 0;
    run_bench(*flags);
  });
}

}  // namespace remat::cli
