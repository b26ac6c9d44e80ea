// `remat bench`: where each strategy stands on the memory/time curve, measured in one run. Every
// manual policy and the optimal plan at each budget run the same batch on the same model in
// interleaved rounds; the report has a table (with the cost model's predictions beside the
// measurements), CSV, JSON, a Pareto plot, a memory timeline and a Markdown summary, all rendered
// from one set of rows.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include <ATen/ops/zeros_like.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include "commands.h"
#include "model_flags.h"
#include "invocation.h"
#include "progress.h"
#include "remat/memory/memory.h"
#include "remat/base/threads.h"
#include "remat/base/error.h"
#include "remat/internal/files.h"
#include "remat/memory/memory.h"
#include "remat/models/estimator.h"
#include "remat/models/gpt_planning.h"
#include "remat/measure/plan_measurement.h"
#include "strategies.h"
#include "remat/train/config_json.h"
#include "remat/internal/table.h"
#include "remat/planning/shape_costs.h"

namespace remat::cli {
namespace {

struct BenchFlags : StrategyFlags {
  int steps = 3;
  std::vector<std::string> trace;  ///< strategy names; empty: the defaults
  bool no_trace = false;
  std::string lengths;  ///< --lengths as given; empty: the one length --seq
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

// The unchecked plan is the reference for "saved" and "overhead": it is measured even when not listed.
struct BenchMeasurements {
  std::vector<PlanMeasurement> plans;  ///< one per strategy, then the unchecked plan when not listed
  size_t none_index = 0;
  const PlanMeasurement& none() const { return plans[none_index]; }
};

// What every output is rendered from, so that the table, CSV, JSON, plots and report agree.
struct BenchResults {
  std::string title, threads;
  std::vector<Strategy> strategies;
  BenchMeasurements measured;
  std::vector<ParetoPoint> points;
  Table rows{std::vector<Column>{}};
  std::vector<TimelineSeries> timelines;
};

BenchMeasurements measure_strategies(SampleModel& sample, const std::vector<Strategy>& strategies,
                                     const BenchFlags& flags, const std::string& title) {
  const auto& options = flags.model.options;
  std::vector<Plan> plans;
  for (const auto& s : strategies) plans.push_back(s.plan);
  const auto none_it =
      std::find_if(strategies.begin(), strategies.end(), [](const Strategy& s) { return s.name == "none"; });
  const bool none_listed = none_it != strategies.end();
  BenchMeasurements measured;
  measured.none_index = none_listed ? static_cast<size_t>(none_it - strategies.begin()) : plans.size();
  if (!none_listed)
    plans.push_back(Plan::unchecked(models::GptChainShape(options.model.layers(), models::GptGranularity::block)));

  std::cerr << "measuring " << plans.size() << " strategies: one warm-up round, then " << flags.steps
            << " interleaved rounds (" << title << ")\n";
  Progress progress("round", flags.steps + 1, flags.steps + 1);
  const auto started = std::chrono::steady_clock::now();
  auto report_round = [&](int round, int rounds, size_t p) {
    if (p != 0) return;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    progress.update(round + 1,
                    std::string(round == 0 ? "warm-up" : "measured") + ", " + fixed(elapsed, 0) + " s so far");
    (void)rounds;
  };
  measured.plans =
      models::gpt_measure_plans(sample.model, plans, sample.tokens, sample.targets, flags.steps, report_round);
  return measured;
}

std::vector<ParetoPoint> pareto_points(const std::vector<Strategy>& strategies, const BenchMeasurements& measured) {
  std::vector<ParetoPoint> points;
  for (size_t i = 0; i < strategies.size(); ++i) {
    const PlanMeasurement& m = measured.plans[i];
    points.push_back(
        {strategies[i].name, strategies[i].planner, mebibytes(m.activation_peak_bytes), m.step_seconds, false});
  }
  mark_pareto_frontier(points);
  return points;
}

// What both tables show of one strategy's measurement: its budget, its peak against the budget and
// against its prediction.
struct MeasuredCells {
  Cell budget, budget_bytes, peak, predicted_peak, peak_error, within_budget;
};
MeasuredCells measured_cells(const Strategy& s, const PlanMeasurement& m) {
  const nlohmann::json none_value;
  const bool over = s.planner && m.activation_peak_bytes > s.budget_bytes;
  MeasuredCells cells{Cell(s.budget_text, s.planner ? nlohmann::json(s.budget_text) : none_value),
                      Cell("", s.planner ? nlohmann::json(s.budget_bytes) : none_value),
                      Cell(format_bytes(m.activation_peak_bytes) + (over ? " OVER" : ""), m.activation_peak_bytes),
                      Cell("-", none_value),
                      Cell("-", none_value),
                      Cell("", s.planner ? nlohmann::json(!over) : none_value)};
  if (s.prediction) {
    const double error = static_cast<double>(s.prediction->peak_bytes - m.activation_peak_bytes) /
                         static_cast<double>(std::max<int64_t>(m.activation_peak_bytes, 1));
    cells.predicted_peak = Cell(format_bytes(s.prediction->peak_bytes), s.prediction->peak_bytes);
    cells.peak_error = Cell(percent(error), error);
  }
  return cells;
}

// One row per strategy, rendered to the terminal, CSV, JSON and Markdown.
Table strategy_rows(const BenchResults& r, const ModelCosts& costs) {
  Table rows({{"strategy", "strategy"},
              Column::data("kind"),
              Column::data("budget"),
              Column::data("budget_bytes"),
              Column::data("plan"),
              Column::data("granularity"),
              {"activation_peak_bytes", "activation peak"},
              {"saved_fraction", "saved"},
              {"median_step_seconds", "median step"},
              {"overhead_fraction", "overhead"},
              {"predicted_peak_bytes", "predicted peak"},
              {"peak_error_fraction", "peak error"},
              {"predicted_overhead_fraction", "predicted overhead"},
              Column::data("within_budget"),
              {"on_pareto_frontier", "Pareto"}});
  const PlanMeasurement& none = r.measured.none();
  const Prediction predicted_none = costs.unchecked();
  const nlohmann::json none_value;
  for (size_t i = 0; i < r.strategies.size(); ++i) {
    const Strategy& s = r.strategies[i];
    const PlanMeasurement& m = r.measured.plans[i];
    const double saved =
        1.0 - static_cast<double>(m.activation_peak_bytes) / static_cast<double>(none.activation_peak_bytes);
    const double overhead = paired_time_ratio(m, none) - 1.0;  // per round: drift cancels
    const MeasuredCells cells = measured_cells(s, m);
    Cell predicted_overhead("-", none_value);
    if (s.prediction) {
      const double fraction = remat::predicted_overhead(*s.prediction, predicted_none);
      predicted_overhead = Cell(percent(fraction), fraction);
    }
    rows.add_row({s.name, s.planner ? "planner" : "policy", cells.budget, cells.budget_bytes, s.plan.to_string(),
                  s.plan.granularity, cells.peak, Cell(fixed(100.0 * saved, 1) + "%", saved),
                  Cell(format_seconds(m.step_seconds), m.step_seconds), Cell(percent(overhead), overhead),
                  cells.predicted_peak, cells.peak_error, predicted_overhead, cells.within_budget,
                  Cell(r.points[i].on_frontier ? "*" : "", r.points[i].on_frontier)});
  }
  return rows;
}

std::vector<TimelineSeries> record_timelines(SampleModel& sample, const std::vector<Strategy>& strategies,
                                             const std::vector<std::string>& trace_names, uint64_t seed) {
  if (trace_names.empty()) return {};
  std::cerr << "recording the memory timeline of " << trace_names.size() << " strategies...\n";
  // measure_plans leaves the model as it found it, gradients unallocated: trace a steady-state
  // step, with them allocated as after a first training step.
  for (auto& p : sample.model->parameters()) {
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
  }
  return trace_strategies(sample, strategies, trace_names, seed);
}

// Returns every file named in the report: bench.json comes second though it is written last, once
// the report is complete.
std::vector<std::string> write_csv_profile_and_plots(const std::filesystem::path& out, const BenchFlags& flags,
                                                     const ModelCosts& costs, const BenchResults& r) {
  std::vector<std::string> files = {(out / "bench.csv").string(), (out / "bench.json").string(),
                                    (out / "profile.json").string()};
  write_file_atomically(files[0], r.rows.csv());
  save_profile(costs, files[2]);  // `remat plan --profile` on it gives the same plans again
  if (!flags.no_plots) {
    std::vector<PlotMarker> budget_markers;
    for (const auto& s : r.strategies) {
      if (s.planner) budget_markers.push_back({"budget " + s.budget_text, mebibytes(s.budget_bytes)});
    }
    for (const auto& f : plot_pareto(out.string(), "remat bench: " + r.title, r.points, budget_markers)) {
      files.push_back(f);
    }
    if (!r.timelines.empty()) {
      const std::string timeline_title = "Activation memory over one training step: " + r.title;
      for (const auto& f : plot_timeline(out.string(), timeline_title, r.timelines)) files.push_back(f);
    }
  }
  return files;
}

std::string markdown_report(const BenchFlags& flags, const BenchResults& r) {
  std::string md;
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  md += "# remat bench: " + r.title + "\n\nMeasured " + date + " with LibTorch " + TORCH_VERSION + " on " + r.threads +
        ".\n\n    " + invocation() + "\n\n" +
        "Every strategy runs forward + backward on the same batch and model; one warm-up round, then " +
        std::to_string(flags.steps) +
        " rounds in which every strategy takes one step in turn (interleaved, so machine drift hits all alike). "
        "Activation peak: the most bytes held above parameters, gradients and batch during the step, counted "
        "exactly by remat's tracking allocator (largest over the rounds). Step time: the median; overhead: the median "
        "over rounds of the step's ratio to the unchecked step of the same round. "
        "Predictions come from the profiled cost model that the planner optimises, saved as `profile.json` "
        "(`remat plan --profile profile.json --budget 30%` plans again from it).\n\n" +
        r.rows.markdown() +
        "\nPlans (compact form: `[...]` is a checkpointed segment, `:option` what a stage keeps):\n\n";
  for (const auto& s : r.strategies) md += "- " + s.name + ": `" + s.plan.to_string() + "`\n";
  if (gnuplot_available() && !flags.no_plots) {
    md += "\n![activation peak vs step time](pareto.png)\n";
    if (!r.timelines.empty()) md += "\n![memory timeline](timeline.png)\n";
  }
  return md;
}

nlohmann::json json_report(const BenchFlags& flags, const BenchResults& r) {
  const auto& options = flags.model.options;
  const PlanMeasurement& none = r.measured.none();
  nlohmann::json report = {{"command", invocation()},
                           {"model", train::gpt_config_json(options.model)},
                           {"threads", r.threads},
                           {"torch_version", TORCH_VERSION},
                           {"steps", flags.steps},
                           {"unchecked_activation_peak_bytes", none.activation_peak_bytes},
                           {"unchecked_median_step_seconds", none.step_seconds},
                           {"strategies", r.rows.json()}};
  nlohmann::json all_steps = nlohmann::json::object();  // every measured step, for other statistics
  for (size_t i = 0; i < r.strategies.size(); ++i) {
    all_steps[r.strategies[i].name] = r.measured.plans[i].all_step_seconds;
  }
  report["step_seconds"] = all_steps;
  report["model"]["batch"] = options.batch;
  return report;
}

// --lengths: every strategy again at each sequence length, on the same model (its --seq the longest)
// fed the sample batch's first positions, as variable-length training feeds it. A length's plans are
// made from its costs: profiled at the least, middle and greatest length, the others from their fit
// in the length (ShapeCosts), as the trainer plans them.
struct LengthRun {
  int64_t length = 0;
  bool fitted = false;
  double planning_seconds = 0;  ///< every strategy's plan at this length
  std::vector<Strategy> strategies;
  BenchMeasurements measured;
};

std::pair<at::Tensor, at::Tensor> batch_of_length(const SampleModel& sample, int64_t length) {
  return {sample.tokens.narrow(1, 0, length).contiguous(), sample.targets.narrow(1, 0, length).contiguous()};
}

// Every length's costs and plans, before anything is measured: a budget no plan fits at some length
// fails the run before it has taken any time.
// `at_longest`: the main bench's costs, of the model's --seq, profiled on the same batch.
std::vector<LengthRun> plan_lengths(const BenchFlags& flags, const SampleModel& sample, const ModelCosts& at_longest,
                                    const std::vector<int64_t>& lengths, const std::vector<std::string>& policies,
                                    const std::vector<std::string>& budgets) {
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  std::map<int64_t, ModelCosts> profiled;
  for (const int64_t length : ShapeTerms::lengths_to_profile(lengths)) {
    if (length == flags.model.options.model.sequence()) {
      profiled.emplace(length, at_longest);
      continue;
    }
    std::cerr << "profiling the GPT's stages at length " << length << " (" << flags.planning.repeats
              << " interleaved repeats)...\n";
    const auto [tokens, targets] = batch_of_length(sample, length);
    profiled.emplace(length, models::profile_gpt(sample.model, tokens, targets,
                                                 PlanningOptions().profile().repeats(flags.planning.repeats),
                                                 CheckpointMode::reentrant));
  }
  std::optional<ShapeCosts> fit;
  if (profiled.size() >= 3) {
    std::vector<ShapedCosts> samples;
    for (const auto& [length, costs] : profiled) samples.push_back(ShapedCosts{{length}, costs.half});
    fit = ShapeCosts::fit(samples, ShapeTerms::length_only());
  }
  std::vector<LengthRun> runs;
  for (const int64_t length : lengths) {
    LengthRun run;
    run.length = length;
    const auto found = profiled.find(length);
    run.fitted = found == profiled.end();
    const auto start = Clock::now();
    const ModelCosts costs = run.fitted ? ModelCosts{fit->at({length})} : found->second;
    try {
      run.strategies = make_strategies(&costs, flags.model.options.model.layers(), policies, budgets,
                                       flags.planning.slots, flags.checkpoint_modes);
    } catch (const c10::Error& e) {
      const std::string message = e.what_without_backtrace();
      const std::string prefix = "remat: ";
      REMAT_CHECK(false, "--lengths: at length ", length, ": ",
                  message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message);
    }
    run.planning_seconds = seconds_since(start);
    runs.push_back(std::move(run));
  }
  return runs;
}

void measure_lengths(const BenchFlags& flags, const SampleModel& sample, std::vector<LengthRun>& runs) {
  for (LengthRun& run : runs) {
    const auto [tokens, targets] = batch_of_length(sample, run.length);
    SampleModel at_length{sample.model, tokens, targets};
    run.measured =
        measure_strategies(at_length, run.strategies, flags,
                           model_title(flags.model.options) + ", batches of length " + std::to_string(run.length));
  }
}

// One row per length and strategy: what the plan held and took at that length, against its
// prediction and the unchecked step of the same length.
Table length_rows(const std::vector<LengthRun>& runs) {
  Table rows({{"sequence", "length"},
              {"strategy", "strategy"},
              {"costs", "costs"},
              Column::data("budget"),
              Column::data("budget_bytes"),
              {"activation_peak_bytes", "activation peak"},
              {"predicted_peak_bytes", "predicted peak"},
              {"peak_error_fraction", "peak error"},
              {"median_step_seconds", "median step"},
              {"overhead_fraction", "overhead"},
              Column::data("within_budget"),
              {"planning_seconds", "planned in"}});
  for (const LengthRun& run : runs) {
    const PlanMeasurement& none = run.measured.none();
    const std::string costs = run.fitted ? "fitted" : "profiled";
    for (size_t i = 0; i < run.strategies.size(); ++i) {
      const Strategy& s = run.strategies[i];
      const PlanMeasurement& m = run.measured.plans[i];
      const MeasuredCells cells = measured_cells(s, m);
      const double overhead = paired_time_ratio(m, none) - 1.0;
      rows.add_row({Cell(std::to_string(run.length), run.length), s.name, costs, cells.budget, cells.budget_bytes,
                    cells.peak, cells.predicted_peak, cells.peak_error,
                    Cell(format_seconds(m.step_seconds), m.step_seconds), Cell(percent(overhead), overhead),
                    cells.within_budget,
                    Cell(i == 0 ? format_seconds(run.planning_seconds) : "", run.planning_seconds)});
    }
  }
  return rows;
}

// --lengths, checked before anything is profiled: each length at most the model's --seq (its
// positions), and no saved profile (that is of one length; each length's costs are made here).
std::vector<int64_t> checked_lengths(const BenchFlags& flags) {
  if (flags.lengths.empty()) return {};
  const std::vector<int64_t> lengths = parse_lengths(flags.lengths);
  const int64_t longest = flags.model.options.model.sequence();
  for (const int64_t length : lengths) {
    REMAT_CHECK(length <= longest, "--lengths: ", length, " is longer than the model's ", longest,
                " positions; give lengths up to --seq (or a larger --seq).");
  }
  REMAT_CHECK(flags.planning.profile_file.empty(),
              "--lengths: --profile is a profile of one length; leave it out (each length's costs are profiled or "
              "fitted here).");
  return lengths;
}

void run_bench(BenchFlags& flags) {
  const auto [out, policies, budgets] = check_strategy_flags(flags);
  const auto& options = flags.model.options;
  std::ostream& human = human_output(flags.json);
  const std::vector<std::string> trace_names = traced_names(flags, policies, budgets);
  const std::vector<int64_t> lengths = checked_lengths(flags);
  const ModelCosts costs = strategy_costs(flags);
  BenchResults r;
  r.strategies =
      make_strategies(&costs, options.model.layers(), policies, budgets, flags.planning.slots, flags.checkpoint_modes);
  install_cpu_memory_tracker();
  SampleModel sample = make_sample_model(options);
  r.threads = set_cpu_threads(options.threads).to_string();
  r.title = model_title(options);

  std::vector<LengthRun> length_runs;
  if (!lengths.empty()) length_runs = plan_lengths(flags, sample, costs, lengths, policies, budgets);
  r.measured = measure_strategies(sample, r.strategies, flags, r.title);
  r.points = pareto_points(r.strategies, r.measured);
  r.rows = strategy_rows(r, costs);
  human << "\n"
        << r.title << "; median of " << flags.steps
        << " interleaved steps (overheads paired per round), exact activation bytes\n";
  r.rows.print(human);
  human << "(* on the Pareto frontier: no other strategy is both smaller and faster)\n";
  r.timelines = record_timelines(sample, r.strategies, trace_names, options.seed);

  std::vector<std::string> files = write_csv_profile_and_plots(out, flags, costs, r);
  std::string markdown = markdown_report(flags, r);
  nlohmann::json report = json_report(flags, r);
  if (!lengths.empty()) {
    measure_lengths(flags, sample, length_runs);
    const Table length_table = length_rows(length_runs);
    human << "\nPer sequence length (the model's first positions of the same batch; median of " << flags.steps
          << " interleaved steps; costs profiled at up to three lengths, the rest fitted)\n";
    length_table.print(human);
    files.push_back((out / "lengths.csv").string());
    write_file_atomically(files.back(), length_table.csv());
    report["lengths"] = length_table.json();
    markdown +=
        "\n## Per sequence length\n\nEach strategy at each length of `--lengths`, on the same model fed the "
        "first positions of the same batch. A length's costs are profiled at the least, middle and greatest "
        "length and fitted in the length for the others (`costs`); its plans are made from them "
        "(`planned in`: every strategy's plan at that length).\n\n" +
        length_table.markdown();
  }
  files.push_back((out / "report.md").string());
  write_file_atomically(files.back(), markdown);
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
  CLI::App* bench = app.add_subcommand("bench",
                                       "Measure every policy and the planner at budgets, interleaved: table, CSV, "
                                       "JSON, Pareto plot, memory timeline, report");
  add_strategy_flags(*bench, *flags, "Also run the optimal plan for each of these activation budgets ('' for none)");
  add_measure_steps_option(*bench, flags->steps,
                           "Measured rounds after one warm-up round (each strategy one step per round)");
  bench
      ->add_option("--trace", flags->trace,
                   "Strategies whose memory timeline to plot (default: none, block, the middle budget's optimal plan)")
      ->group("Output");
  bench->add_flag("--no-trace", flags->no_trace, "Skip the memory timeline")->group("Output");
  bench
      ->add_option("--lengths", flags->lengths,
                   "Also measure every strategy at each of these sequence lengths, up to --seq: MIN:MAX[:STEP] "
                   "(64:256:64) or a list (64,128,256); costs profiled at three lengths and fitted in the length")
      ->group("Planning");
  bench->callback([flags, bench] {
    flags->default_policies = bench->get_option("--policies")->count() == 0;
    run_bench(*flags);
  });
}

}  // namespace remat::cli
