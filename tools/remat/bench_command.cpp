// `remat bench`: where each strategy stands on the memory/time curve, measured in one run. Every
// manual policy and the optimal plan at each budget run the same batch on the same model in
// interleaved rounds; the report has a table (with the cost model's predictions beside the
// measurements), CSV, JSON, a Pareto plot, a memory timeline and a Markdown summary.
// `remat trace`: the memory timeline alone, for chosen strategies.
#include "bench_command.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>
#include <ATen/ops/zeros_like.h>
#include <torch/version.h>
#include <unistd.h>

#include "files.h"
#include "invocation.h"
#include "model_flags.h"
#include "planning.h"
#include "plots.h"
#include "remat/models/gpt_policies.h"
#include "remat/cpu_threads.h"
#include "remat/error.h"
#include "remat/memory.h"
#include "remat/memory_timeline.h"
#include "remat/models/estimator.h"
#include "remat/policies.h"
#include "table.h"

namespace remat::cli {
namespace {

const std::vector<std::string> kDefaultPolicies = {"none",   "block", "every:2",   "every:4",   "segments:2",
                                                   "segments:4", "sqrt", "ffn", "attn",  "ffn+attn",
                                                   "selective",  "matmul-inputs", "block,skip-ends"};

struct BenchFlags {
  ModelFlags model;
  std::vector<std::string> policies = kDefaultPolicies;
  std::string budgets = "30%,50%,70%";
  std::string profile_file;
  int repeats = 3;
  int64_t slots = 1000;
  int steps = 3;
  std::string out_dir = "remat-bench";
  std::vector<std::string> trace;  ///< strategy names; empty: the defaults
  bool no_trace = false;
  bool no_plots = false;
  bool default_policies = true;  ///< not given: drop the ones that do not apply to this depth
};

struct Strategy {
  std::string name;
  bool planner = false;
  std::string budget_text;  ///< planner strategies: the budget as given
  int64_t budget_bytes = 0;
  Plan plan;
  std::optional<Prediction> prediction;
};

double to_mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

std::string signed_percent(double fraction) {
  return (fraction >= 0 ? "+" : "") + fixed(100.0 * fraction, 1) + "%";
}

// Progress on stderr: one line rewritten in place on a terminal, a line per round otherwise.
class Progress {
 public:
  Progress() : terminal_(isatty(STDERR_FILENO) != 0) {}
  void update(const std::string& text, bool new_round) {
    if (terminal_) {
      std::cerr << "\r\033[K" << text << std::flush;
    } else if (new_round) {
      std::cerr << text << "\n";
    }
  }
  void done() {
    if (terminal_) std::cerr << "\r\033[K" << std::flush;
  }

 private:
  bool terminal_;
};

std::vector<Strategy> make_strategies(const ModelCosts* costs, int64_t layers, const std::vector<std::string>& policies,
                                      const std::vector<std::string>& budgets, int64_t slots) {
  std::vector<Strategy> strategies;
  for (const auto& policy : policies) {
    Strategy s;
    s.name = policy;
    s.plan = models::gpt_policy_plan(policy, models::GptChainShape(layers, models::gpt_policy_granularity(policy)));
    if (costs != nullptr) s.prediction = costs->predict(s.plan);
    strategies.push_back(std::move(s));
  }
  for (const auto& text : budgets) {
    REMAT_CHECK(costs != nullptr, "planning for a budget needs a profile.");
    Strategy s;
    s.name = "optimal " + text;
    s.planner = true;
    s.budget_text = text;
    const BudgetPlan choice = models::gpt_plan_for_budget(*costs, text, slots);
    s.budget_bytes = choice.budget_bytes;
    s.plan = choice.plan;
    s.prediction = choice.prediction;
    strategies.push_back(std::move(s));
  }
  return strategies;
}

ModelCosts costs_for(const BenchFlags& flags) {
  const auto& options = flags.model.options;
  if (!flags.profile_file.empty()) {
    return load_profile_for(flags.profile_file, options);
  }
  std::cerr << "profiling the GPT's stages (" << flags.repeats << " interleaved repeats)...\n";
  return profile_model(options, flags.repeats);
}

// One step of `plan` recorded at every allocation and free; the model's gradients must already
// exist (a warm-up step) so the timeline shows a steady-state step.
TimelineSeries trace_step(SampleModel& sample, const Strategy& strategy, uint64_t seed) {
  models::GptChain chain(sample.model, strategy.plan.granularity);
  chain.set_targets(sample.targets);
  TimelineSeries series;
  series.name = strategy.name;
  MemoryTimeline timeline;
  const StepMeasurement m = seeded_step(sample, chain, strategy.plan, seed).measurement;
  series.events = timeline.stop();
  series.base_bytes = m.bytes_before_forward;
  series.caption = "peak " + fixed(to_mib(m.activation_peak_bytes()), 1) + " MiB, step " + format_seconds(m.step_seconds);
  return series;
}

std::string model_title(const train::TrainOptions& o) {
  const auto& m = o.model;
  return "GPT " + std::to_string(m.layers) + " layers, hidden " + std::to_string(m.hidden) + ", " +
         std::to_string(m.heads) + " heads, seq " + std::to_string(m.sequence) + ", batch " + std::to_string(o.batch) +
         ", dropout " + fixed(m.dropout, 2) + ", fp32";
}

std::filesystem::path prepare_out_dir(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  REMAT_CHECK(!error && std::filesystem::is_directory(dir), "--out: cannot create the folder '", dir, "' (",
              error.message(), "); give a writable path.");
  return std::filesystem::path(dir);
}

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

// The policies that will run: all given ones, or the defaults that apply to this depth.
std::vector<std::string> runnable_policies(const BenchFlags& flags, int64_t layers) {
  std::vector<std::string> out;
  for (const auto& policy : flags.policies) {
    try {
      models::gpt_policy_plan(policy, models::GptChainShape(layers, models::gpt_policy_granularity(policy)));
    } catch (const c10::Error&) {
      if (flags.default_policies) continue;
      throw;
    }
    REMAT_CHECK(std::find(out.begin(), out.end(), policy) == out.end(), "--policies lists '", policy, "' twice.");
    out.push_back(policy);
  }
  return out;
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

// What bench and trace check before profiling or measuring anything: the model, the output
// folder, the policies that apply and the budgets' form.
struct CheckedFlags {
  std::filesystem::path out;
  std::vector<std::string> policies, budgets;
};

CheckedFlags check_flags(BenchFlags& flags) {
  flags.model.apply_preset();
  flags.model.options.model.validate();
  CheckedFlags checked{prepare_out_dir(flags.out_dir), runnable_policies(flags, flags.model.options.model.layers),
                       budget_list(flags.budgets)};
  REMAT_CHECK(!checked.policies.empty() || !checked.budgets.empty(), "nothing to run: give --policies or --budgets.");
  return checked;
}

void run_bench(BenchFlags& flags) {
  const auto [out, policies, budgets] = check_flags(flags);
  const auto& options = flags.model.options;
  const std::vector<std::string> trace_names = traced_names(flags, policies, budgets);
  const ModelCosts costs = costs_for(flags);
  const std::vector<Strategy> strategies = make_strategies(&costs, options.model.layers, policies, budgets, flags.slots);
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
  Progress progress;
  const auto started = std::chrono::steady_clock::now();
  const auto measured = train::measure_plans(
      sample.model, plans, sample.tokens, sample.targets, flags.steps, [&](int round, int rounds, size_t p) {
        const std::string name = p < strategies.size() ? strategies[p].name : "none";
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        progress.update("[bench] " + std::string(round == 0 ? "warm-up" : "round " + std::to_string(round) + "/" +
                                                                              std::to_string(rounds - 1)) +
                            ", strategy " + std::to_string(p + 1) + "/" + std::to_string(plans.size()) + ": " + name +
                            " (" + fixed(elapsed, 0) + " s)",
                        p == 0);
      });
  progress.done();
  const PlanMeasurement& none = measured[none_index];

  std::vector<ParetoPoint> points;
  for (size_t i = 0; i < strategies.size(); ++i) {
    points.push_back({strategies[i].name, strategies[i].planner, to_mib(measured[i].activation_peak_bytes),
                      measured[i].step_seconds, false});
  }
  mark_pareto_frontier(points);

  // The table, CSV and JSON share one row per strategy.
  Table table({"strategy", "activation peak", "saved", "median step", "overhead", "predicted peak", "peak error",
               "predicted overhead", "Pareto"});
  std::ostringstream csv;
  csv << "strategy,kind,budget_bytes,plan,activation_peak_bytes,saved_fraction,median_step_seconds,overhead_fraction,"
         "predicted_peak_bytes,predicted_overhead_fraction,on_pareto_frontier\n";
  nlohmann::json rows = nlohmann::json::array();
  const double predicted_none = costs.unchecked().step_seconds;
  for (size_t i = 0; i < strategies.size(); ++i) {
    const Strategy& s = strategies[i];
    const PlanMeasurement& m = measured[i];
    const double saved = 1.0 - static_cast<double>(m.activation_peak_bytes) / static_cast<double>(none.activation_peak_bytes);
    const double overhead = m.step_seconds / none.step_seconds - 1.0;
    std::string predicted_peak = "-", peak_error = "-", predicted_overhead = "-";
    nlohmann::json row = {{"strategy", s.name}, {"kind", s.planner ? "planner" : "policy"}, {"plan", s.plan.to_string()},
                          {"granularity", s.plan.granularity}, {"activation_peak_bytes", m.activation_peak_bytes},
                          {"saved_fraction", saved}, {"median_step_seconds", m.step_seconds},
                          {"step_seconds", m.all_step_seconds}, {"overhead_fraction", overhead},
                          {"on_pareto_frontier", points[i].on_frontier}};
    if (s.planner) {
      row["budget"] = s.budget_text;
      row["budget_bytes"] = s.budget_bytes;
      row["within_budget"] = m.activation_peak_bytes <= s.budget_bytes;
    }
    if (s.prediction) {
      const double error = static_cast<double>(s.prediction->peak_bytes - m.activation_peak_bytes) /
                           static_cast<double>(std::max<int64_t>(m.activation_peak_bytes, 1));
      predicted_peak = fixed(to_mib(s.prediction->peak_bytes), 1) + " MiB";
      peak_error = signed_percent(error);
      predicted_overhead = signed_percent(s.prediction->step_seconds / predicted_none - 1.0);
      row["predicted_peak_bytes"] = s.prediction->peak_bytes;
      row["predicted_overhead_fraction"] = s.prediction->step_seconds / predicted_none - 1.0;
    }
    table.add_row({s.name, fixed(to_mib(m.activation_peak_bytes), 1) + " MiB" +
                               (s.planner && m.activation_peak_bytes > s.budget_bytes ? " OVER" : ""),
                   signed_percent(saved).substr(saved >= 0 ? 1 : 0), format_seconds(m.step_seconds),
                   signed_percent(overhead), predicted_peak, peak_error, predicted_overhead,
                   points[i].on_frontier ? "*" : ""});
    csv << csv_field(s.name) << ',' << (s.planner ? "planner" : "policy") << ',' << (s.planner ? std::to_string(s.budget_bytes) : "")
        << ',' << csv_field(s.plan.to_string()) << ',' << m.activation_peak_bytes << ',' << saved << ','
        << m.step_seconds << ',' << overhead << ',' << (s.prediction ? std::to_string(s.prediction->peak_bytes) : "")
        << ',' << (s.prediction ? std::to_string(s.prediction->step_seconds / predicted_none - 1.0) : "") << ','
        << (points[i].on_frontier ? 1 : 0) << '\n';
    rows.push_back(row);
  }
  const std::string title = model_title(options);
  std::cout << "\n" << title << "; median of " << flags.steps << " interleaved steps, exact activation bytes\n";
  table.print(std::cout);
  std::cout << "(* on the Pareto frontier: no other strategy is both smaller and faster)\n";

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
  write_file_atomically(files[0], csv.str());
  save_profile(costs, files[2]);  // `remat plan --profile` on it gives the same plans again
  if (!flags.no_plots) {
    std::vector<PlotMarker> budgets;
    for (const auto& s : strategies) {
      if (s.planner) budgets.push_back({"budget " + s.budget_text, to_mib(s.budget_bytes)});
    }
    for (const auto& f : plot_pareto(out.string(), "remat bench: " + title, points, budgets)) files.push_back(f);
    if (!timelines.empty()) {
      for (const auto& f : plot_timeline(out.string(), "Activation memory over one training step: " + title, timelines))
        files.push_back(f);
    }
  }

  // The Markdown report.
  std::ostringstream md;
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  md << "# remat bench: " << title << "\n\n"
     << "Measured " << date << " with LibTorch " << TORCH_VERSION << " on " << threads << ".\n\n"
     << "    " << invocation() << "\n\n"
     << "Every strategy runs forward + backward on the same batch and model; one warm-up round, then " << flags.steps
     << " rounds in which every strategy takes one step in turn (interleaved, so machine drift hits all alike). "
     << "Activation peak: the most bytes held above parameters, gradients and batch during the step, counted "
        "exactly by remat's tracking allocator (largest over the rounds). Step time: the median. "
     << "Predictions come from the profiled cost model that the planner optimises, saved as `profile.json` "
        "(`remat plan --profile profile.json --budget 30%` plans again from it).\n\n"
     << "| strategy | activation peak (MiB) | saved vs none | median step (s) | overhead vs none | predicted peak (MiB) "
        "| predicted overhead | Pareto |\n|---|---:|---:|---:|---:|---:|---:|:---:|\n";
  for (size_t i = 0; i < strategies.size(); ++i) {
    const auto& r = rows[i];
    md << "| " << strategies[i].name << " | " << fixed(to_mib(measured[i].activation_peak_bytes), 1) << " | "
       << fixed(100.0 * r["saved_fraction"].get<double>(), 1) << "% | " << fixed(measured[i].step_seconds, 4) << " | "
       << signed_percent(r["overhead_fraction"].get<double>()) << " | "
       << (strategies[i].prediction ? fixed(to_mib(strategies[i].prediction->peak_bytes), 1) : "-") << " | "
       << (r.contains("predicted_overhead_fraction") ? signed_percent(r["predicted_overhead_fraction"].get<double>()) : "-")
       << " | " << (points[i].on_frontier ? "yes" : "") << " |\n";
  }
  md << "\nPlans (compact form: `[...]` is a checkpointed segment, `:option` what a stage keeps):\n\n";
  for (const auto& s : strategies) md << "- " << s.name << ": `" << s.plan.to_string() << "`\n";
  if (gnuplot_available() && !flags.no_plots) {
    md << "\n![activation peak vs step time](pareto.png)\n";
    if (!timelines.empty()) md << "\n![memory timeline](timeline.png)\n";
  }
  files.push_back((out / "report.md").string());
  write_file_atomically(files.back(), md.str());

  nlohmann::json report = {{"command", invocation()},
                           {"model", {{"layers", options.model.layers}, {"hidden", options.model.hidden},
                                      {"heads", options.model.heads}, {"sequence", options.model.sequence},
                                      {"dropout", options.model.dropout}, {"batch", options.batch}}},
                           {"threads", threads},
                           {"torch_version", TORCH_VERSION},
                           {"steps", flags.steps},
                           {"unchecked_activation_peak_bytes", none.activation_peak_bytes},
                           {"unchecked_median_step_seconds", none.step_seconds},
                           {"strategies", rows}};
  write_file_atomically(files[1], report.dump(2) + "\n");
  std::cout << "\nwrote:";
  for (const auto& f : files) std::cout << " " << f;
  std::cout << "\n";
}

void run_trace(BenchFlags& flags) {
  const auto [out, policies, budgets] = check_flags(flags);
  const auto& options = flags.model.options;
  std::optional<ModelCosts> costs;
  if (!budgets.empty()) costs = costs_for(flags);
  const auto strategies = make_strategies(costs ? &*costs : nullptr, options.model.layers, policies, budgets, flags.slots);
  install_cpu_memory_tracker();
  SampleModel sample = make_sample_model(options);
  std::cerr << "warming up " << strategies.size() << " strategies...\n";
  std::vector<std::string> names;
  for (const auto& s : strategies) names.push_back(s.name);
  trace_strategies(sample, strategies, names, options.seed);  // allocates the gradients
  const auto timelines = trace_strategies(sample, strategies, names, options.seed);
  Table table({"strategy", "events", "activation peak", "step"});
  for (const auto& t : timelines) {
    int64_t peak = 0;
    for (const auto& e : t.events) peak = std::max(peak, e.bytes - t.base_bytes);
    table.add_row({t.name, std::to_string(t.events.size()), fixed(to_mib(peak), 1) + " MiB",
                   format_seconds(t.events.empty() ? 0.0 : t.events.back().seconds)});
  }
  table.print(std::cout);
  std::vector<std::string> files;
  if (flags.no_plots) {
    for (const auto& t : timelines) {
      files.push_back((out / ("timeline-" + std::to_string(files.size()) + ".csv")).string());
      write_memory_events_csv(t.events, files.back());
    }
  } else {
    files = plot_timeline(out.string(), "Activation memory over one training step: " + model_title(options), timelines);
  }
  std::cout << "wrote:";
  for (const auto& f : files) std::cout << " " << f;
  std::cout << "\n";
}

void add_common_flags(CLI::App& command, BenchFlags& flags) {
  flags.model.add_to(command);
  command.add_option("--data", flags.model.options.data_file, "Take the batch from this text file")->group("Model");
  command.add_option("--policies", flags.policies, "Manual policies to run (see `remat policies`), space-separated")
      ->capture_default_str()->group("Strategies");
  command.add_option("--profile", flags.profile_file, "Cost model for the planner (remat profile --save) instead of profiling")
      ->group("Strategies");
  command.add_option("--repeats", flags.repeats, "Profiling runs per stage")->capture_default_str()->check(CLI::Range(1, 100))->group("Strategies");
  command.add_option("--slots", flags.slots, "Memory grid of the planner")->capture_default_str()->check(CLI::Range(1, 100000))->group("Strategies");
  command.add_option("--out", flags.out_dir, "Folder for the files written")->capture_default_str()->group("Output");
  command.add_flag("--no-plots", flags.no_plots, "Write data only; do not run gnuplot")->group("Output");
}

}  // namespace

void add_bench_commands(CLI::App& app) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* bench = app.add_subcommand(
      "bench", "Measure every policy and the planner at budgets, interleaved: table, CSV, JSON, Pareto plot, memory timeline, report");
  add_common_flags(*bench, *flags);
  bench->add_option("--budgets", flags->budgets, "Planner budgets, comma-separated (bytes, KiB/MiB/GiB, or % of the unchecked peak); '' for none")
      ->capture_default_str()->group("Strategies");
  bench->add_option("--steps", flags->steps, "Measured rounds (each strategy one step per round) after one warm-up round")
      ->capture_default_str()->check(CLI::Range(1, 1000))->group("Measurement");
  bench->add_option("--trace", flags->trace, "Strategies whose memory timeline to plot (default: none, block, the middle budget's optimal plan)")
      ->group("Output");
  bench->add_flag("--no-trace", flags->no_trace, "Skip the memory timeline")->group("Output");
  bench->callback([flags, bench] {
    flags->default_policies = bench->get_option("--policies")->count() == 0;
    run_bench(*flags);
  });

  auto trace_flags = std::make_shared<BenchFlags>();
  trace_flags->policies = {"none", "block", "selective"};
  trace_flags->budgets = "";
  trace_flags->out_dir = "remat-trace";
  CLI::App* trace = app.add_subcommand(
      "trace", "Record and plot activation bytes over one training step (every allocation and free), per strategy");
  add_common_flags(*trace, *trace_flags);
  trace->add_option("--budgets", trace_flags->budgets, "Also trace the optimal plan for these budgets (comma-separated)")->group("Strategies");
  trace->callback([trace_flags, trace] {
    trace_flags->default_policies = trace->get_option("--policies")->count() == 0;
    run_trace(*trace_flags);
  });
}

}  // namespace remat::cli
