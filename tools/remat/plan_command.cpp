// `remat plan`: a policy's plan, or the fastest plan under one or several memory budgets, with
// every manual policy compared and, with --measure, predictions checked against real steps.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "model_flags.h"
#include "planning.h"
#include "plots.h"
#include "remat/base/error.h"
#include "remat/internal/files.h"
#include "remat/models/estimator.h"
#include "remat/models/gpt_policies.h"
#include "remat/measure/plan_comparison.h"
#include "remat/measure/plan_measurement.h"
#include "remat/planning/throughput.h"
#include "remat/train/corpus.h"
#include "remat/internal/table.h"
#include "remat/memory/memory.h"

namespace remat::cli {
namespace {

struct PlanFlags {
  ModelFlags model;
  std::string policy;
  std::vector<std::string> budgets;
  PlanningFlags planning;
  std::string save_file;
  bool json = false;
  bool measure = false;
  int measure_steps = 3;
  bool verify = false;
  bool verify_fit = true;
  std::string maximize;  // "throughput": choose the micro-batch with the plan
  std::string plot_dir;
};

// `--verify`: one step plain and one under `plan` from the same RNG state, on the sample batch.
void print_verification(const train::TrainOptions& options, const Plan& plan, std::ostream& out) {
  SampleModel sample = make_sample_model(options);
  models::GptChain chain(sample.model, models::gpt_granularity_of(plan));
  chain.set_targets(sample.targets);
  out << "verify: " << verify_plan(chain, plan, sample.tokens).to_string();
}

void run_policy_plan(PlanFlags& flags) {
  const auto& config = flags.model.options.model;
  config.validate();
  const std::string policy = flags.policy.empty() ? "block" : flags.policy;
  const PlanRequest request = PlanRequest::of_policy(policy).mode(flags.model.checkpoint_mode);
  const Plan plan = make_plan(request, models::gpt_plan_subject(config.layers())).plan;
  if (flags.json) {
    std::cout << plan.to_json() << "\n";
  } else {
    std::cout << "policy " << policy << " for a GPT with " << config.describe() << " (" << plan.stage_names.size()
              << " stages, granularity " << plan.granularity << "):\n  " << plan.to_string() << "\n";
  }
  if (!flags.save_file.empty()) {
    write_file_atomically(flags.save_file, plan.to_json() + "\n");
    if (!flags.json) std::cout << "saved to " << flags.save_file << "\n";
  }
  if (flags.verify) print_verification(flags.model.options, plan, flags.json ? std::cerr : std::cout);
}

// A budget as given, its optimal plan, and what every planner and manual policy gives at the same bytes.
struct BudgetPlans {
  std::string text;
  PlanResult optimal;
  std::vector<PlanResult> others;
};

ModelCosts load_or_profile(const PlanFlags& flags, std::ostream& out) {
  const auto& options = flags.model.options;
  if (!flags.planning.profile_file.empty()) return load_profile_for(flags.planning.profile_file, options);
  out << "profiling the GPT (" << options.model.describe() << ", batch " << options.batch << ")...\n";
  return profile_model(options, flags.planning.repeats, flags.model.checkpoint_mode);
}

std::vector<BudgetPlans> plan_budgets(const ModelCosts& costs, const std::vector<std::string>& budgets,
                                      const PlanFlags& flags) {
  std::vector<BudgetPlans> results;
  // Each budget's plan is run on the sample batch: a plan whose measured peak passes the budget is
  // planned again, and one the cost model cannot tell from a rule of thumb is timed against it
  // (make_plan), unless --no-verify-fit: then the prediction is trusted.
  std::optional<SampleModel> sample;
  if (flags.verify_fit) sample.emplace(make_sample_model(flags.model.options));
  for (const auto& text : budgets) {
    PlanRequest request = PlanRequest::of_budget(Budget::parse(text));
    request.options().planner(PlannerOptions().mode(flags.model.checkpoint_mode).memory_slots(flags.planning.slots));
    const PlanSubject subject =
        sample ? models::gpt_plan_subject(sample->model, sample->tokens, sample->targets).costs(costs.half)
               : models::gpt_plan_subject(costs);
    BudgetPlans r{text, make_plan(request, subject), {}};
    // The others are predicted, as the optimal plan was chosen: at the budget's share of the
    // predicted unchecked peak (the optimal plan's budget_bytes is in measured bytes where verified).
    r.others = models::gpt_compare_planners(costs, Budget::parse(text), request.options().planner());
    results.push_back(std::move(r));
  }
  return results;
}

// Prints the budget's optimal plan beside every other planner and policy; returns the budget's JSON.
nlohmann::json print_budget_result(const BudgetPlans& r, std::ostream& out) {
  out << "\nbudget " << r.text << " = " << format_bytes(r.optimal.budget_bytes)
      << (r.optimal.measured_unchecked_peak_bytes >= 0 ? " of the measured unchecked peak" : "") << " (least feasible "
      << format_bytes(r.optimal.least_feasible_budget_bytes) << "; planned in "
      << fixed(r.optimal.solve_seconds * 1e3, 1) << " ms)\n  optimal plan: " << r.optimal.plan.to_string()
      << "\n  predicted activation peak " << format_bytes(r.optimal.prediction.peak_bytes) << ", step "
      << fixed(r.optimal.prediction.step_seconds, 3) << " s, overhead " << percent(r.optimal.predicted_overhead())
      << " ± " << percent(r.optimal.predicted_overhead_spread()) << "\n";
  if (!r.optimal.timed_under.empty()) out << "  timed under " << r.optimal.timed_under << "\n";
  if (r.optimal.measured_peak_bytes >= 0) {
    out << "  measured activation peak " << format_bytes(r.optimal.measured_peak_bytes) << " (one step"
        << (r.optimal.replans > 0 ? ", after " + std::to_string(r.optimal.replans) + " re-plans" : std::string())
        << ")\n";
  }
  if (!r.optimal.measured_choice.reason.empty())
    out << "  measured choice: " << r.optimal.measured_choice.reason << "\n";
  Table table({"strategy", "predicted peak", "fits", "predicted overhead"});
  const MeasuredChoice& choice = r.optimal.measured_choice;
  const std::string chosen =
      choice.measured && choice.chosen > 0 ? "measured choice: " + choice.candidates[choice.chosen].name : "optimal";
  table.add_row(
      {chosen, format_bytes(r.optimal.prediction.peak_bytes), "yes", percent(r.optimal.predicted_overhead())});
  nlohmann::json policies = nlohmann::json::array();
  for (const auto& o : r.others) {
    const bool has_plan = !o.plan.stage_names.empty();
    table.add_row({o.name, has_plan ? format_bytes(o.prediction.peak_bytes) : "-", o.feasible ? "yes" : "no",
                   has_plan ? percent(o.predicted_overhead()) : "-"});
    policies.push_back({{"name", o.name},
                        {"fits", o.feasible},
                        {"predicted_peak_bytes", has_plan ? nlohmann::json(o.prediction.peak_bytes) : nlohmann::json()},
                        {"predicted_overhead", has_plan ? nlohmann::json(o.predicted_overhead()) : nlohmann::json()}});
  }
  table.print(out);
  nlohmann::json result = {
      {"budget", r.text},
      {"budget_bytes", r.optimal.budget_bytes},
      {"plan", r.optimal.plan.to_string()},
      {"plan_json", nlohmann::json::parse(r.optimal.plan.to_json())},
      {"predicted_peak_bytes", r.optimal.prediction.peak_bytes},
      {"predicted_step_seconds", r.optimal.prediction.step_seconds},
      {"predicted_overhead", r.optimal.predicted_overhead()},
      {"predicted_overhead_spread", r.optimal.predicted_overhead_spread()},
      {"timed_under", r.optimal.timed_under},
      {"least_feasible_budget_bytes", r.optimal.least_feasible_budget_bytes},
      {"verified_peak_bytes",
       r.optimal.measured_peak_bytes >= 0 ? nlohmann::json(r.optimal.measured_peak_bytes) : nlohmann::json()},
      {"replans", r.optimal.replans},
      {"measured_choice", r.optimal.measured_choice.reason},
      {"source", r.optimal.source},
      {"unchecked_peak_bytes", r.optimal.unchecked.peak_bytes},
      {"solve_seconds", r.optimal.solve_seconds},
      {"policies", policies}};
  return result;
}

// What --measure runs, each distinct plan once: the unchecked plan first (the reference for every
// overhead), then each budget's optimal plan and the manual policies.
// Each budget's optimal plan as measured against its prediction and the fastest manual policy that fits.
void print_budget_measurements(const MeasuredComparison& c, const std::vector<BudgetPlans>& results,
                               nlohmann::json& json_results, std::ostream& out) {
  Table table({"budget", "optimal: predicted peak", "measured peak", "error", "predicted overhead", "measured overhead",
               "measured 95%", "in spread", "best manual fitting", "its measured overhead", "optimal <= best"});
  for (size_t b = 0; b < c.budgets.size(); ++b) {
    const BudgetComparison& bc = c.budgets[b];
    const BudgetPlans& r = results[b];
    const int64_t measured_peak = bc.measured.measured.activation_peak_bytes;
    const std::string best_name = bc.best_policy ? c.policies[*bc.best_policy].name : "(none fits)";
    const double error =
        static_cast<double>(r.optimal.prediction.peak_bytes - measured_peak) / static_cast<double>(measured_peak);
    table.add_row({r.text + " (" + format_bytes(r.optimal.budget_bytes) + ")",
                   format_bytes(r.optimal.prediction.peak_bytes),
                   format_bytes(measured_peak) + (bc.fits ? "" : " OVER"), percent(error),
                   percent(r.optimal.predicted_overhead()), percent(bc.measured.overhead),
                   percent(bc.measured.overhead_low) + " to " + percent(bc.measured.overhead_high),
                   bc.prediction_within_spread ? "yes" : "no", best_name,
                   bc.best_policy ? percent(c.policies[*bc.best_policy].overhead) : "-",
                   bc.ratio_to_best_policy <= 1 ? "yes" : "no"});
    json_results[b]["measured_peak_bytes"] = measured_peak;
    json_results[b]["measured_overhead"] = bc.measured.overhead;
    json_results[b]["measured_overhead_interval"] = {bc.measured.overhead_low, bc.measured.overhead_high};
    json_results[b]["prediction_within_spread"] = bc.prediction_within_spread;
    json_results[b]["best_manual"] = best_name;
    json_results[b]["best_manual_measured_overhead"] =
        bc.best_policy ? nlohmann::json(c.policies[*bc.best_policy].overhead) : nlohmann::json();
  }
  table.print(out);
}

void print_manual_measurements(const MeasuredComparison& c, std::ostream& out) {
  Table all({"plan", "measured peak", "measured overhead"});
  for (const auto& p : c.policies) {
    all.add_row({p.name, format_bytes(p.measured.activation_peak_bytes), percent(p.overhead)});
  }
  out << "\nmanual policies as measured (unchecked: " << format_bytes(c.unchecked.measured.activation_peak_bytes)
      << ", " << fixed(c.unchecked.measured.step_seconds, 3) << " s):\n";
  all.print(out);
}

void measure_and_compare(const PlanFlags& flags, const std::vector<BudgetPlans>& results, nlohmann::json& json_results,
                         std::ostream& out) {
  // One model, one batch; every plan measured in interleaved rounds.
  const SampleModel sample = make_sample_model(flags.model.options);
  std::vector<PlanResult> optimal;
  for (const auto& r : results) optimal.push_back(r.optimal);
  std::vector<NamedPlan> policies;
  for (const auto& o : results.front().others) {
    if (o.planner == PlannerKind::policy) policies.push_back({o.name, o.plan});
  }
  const Plan unchecked =
      Plan::unchecked(models::GptChainShape(flags.model.options.model.layers(), models::GptGranularity::block));
  const MeasuredComparison c = compare_measured(unchecked, optimal, policies, [&](const std::vector<Plan>& plans) {
    out << "\nmeasuring " << plans.size() << " plans, " << flags.measure_steps << " interleaved steps each...\n";
    return models::gpt_measure_plans(sample.model, plans, sample.tokens, sample.targets, flags.measure_steps);
  });
  print_budget_measurements(c, results, json_results, out);
  print_manual_measurements(c, out);
}

void run_budget_plan(PlanFlags& flags) {
  const auto& options = flags.model.options;
  options.model.validate();
  const std::vector<std::string> budgets = budget_list(flags.budgets);
  REMAT_CHECK(!budgets.empty(), "--budget: give at least one budget, as in --budget 50% or --budget 200MiB.");
  std::ostream& out = human_output(flags.json);
  const ModelCosts costs = load_or_profile(flags, out);
  const Prediction unchecked = costs.unchecked();
  out << "unchecked activation peak (predicted): " << format_bytes(unchecked.peak_bytes) << ", step "
      << fixed(unchecked.step_seconds, 3) << " s\n";

  const std::vector<BudgetPlans> results = plan_budgets(costs, budgets, flags);
  nlohmann::json json_results = nlohmann::json::array();
  for (const auto& r : results) json_results.push_back(print_budget_result(r, out));
  if (flags.measure) measure_and_compare(flags, results, json_results, out);

  if (!flags.save_file.empty()) {
    REMAT_CHECK(results.size() == 1, "--save-plan writes one plan: give one budget.");
    write_file_atomically(flags.save_file, results.front().optimal.plan.to_json() + "\n");
    out << "saved the optimal plan to " << flags.save_file << "\n";
  }
  if (flags.verify) {
    for (const auto& r : results) {
      out << "\nbudget " << r.text << ", ";
      print_verification(options, r.optimal.plan, out);
    }
  }
  if (flags.json)
    std::cout << (json_results.size() == 1 ? json_results[0] : nlohmann::json{{"results", json_results}}).dump(2)
              << "\n";
}

// `--maximize throughput`: under each budget, the micro-batch and plan with the most tokens per
// second (remat/planning/throughput.h), beside no checkpointing at the largest micro-batch that fits and the
// whole batch under its optimal plan; with --measure, each run as well.
struct ThroughputRow {
  std::string budget;
  ThroughputChoice choice;
  std::vector<MeasuredMicroBatch> measured;
};

// Tokens per second of a frontier entry: measured where it was run, else predicted.
double tokens_per_second(const ThroughputRow& row, std::optional<size_t> index, bool unchecked, int64_t sequence) {
  if (!index) return 0;
  const MicroBatchChoice& c = row.choice.frontier[*index];
  for (const auto& m : row.measured) {
    if (m.micro_batch != c.micro_batch) continue;
    return static_cast<double>(sequence) * (unchecked ? m.unchecked_samples_per_second : m.samples_per_second);
  }
  return static_cast<double>(sequence) * (unchecked ? c.unchecked_samples_per_second : c.predicted_samples_per_second);
}

nlohmann::json print_throughput_row(const ThroughputRow& row, int64_t sequence, std::ostream& out) {
  const ThroughputChoice& c = row.choice;
  out << "\nbudget " << row.budget << " = " << format_bytes(c.budget_bytes) << " ("
      << fixed(100.0 * static_cast<double>(c.budget_bytes) / static_cast<double>(c.unchecked_peak_bytes), 0)
      << "% of the unchecked peak at batch " << c.global_batch << ", " << format_bytes(c.unchecked_peak_bytes) << ")\n";
  const bool measured = !row.measured.empty();
  std::vector<Column> header = {"micro-batch",     "x steps",        "plan",           "predicted peak",
                                "predicted tok/s", "unchecked fits", "unchecked tok/s"};
  if (measured) header.insert(header.end(), {"measured peak", "measured tok/s", "unchecked measured tok/s"});
  Table table(header);
  nlohmann::json frontier = nlohmann::json::array();
  for (size_t i = 0; i < c.frontier.size(); ++i) {
    const MicroBatchChoice& f = c.frontier[i];
    const double seq = static_cast<double>(sequence);
    std::string plan = f.planned.feasible ? f.planned.plan.to_string() : "(none fits)";
    if (plan.size() > 48) plan = plan.substr(0, 45) + "...";
    std::vector<Cell> cells = {std::to_string(f.micro_batch) + (c.best == i ? " *" : ""),
                               std::to_string(f.accumulation),
                               plan,
                               f.planned.feasible ? format_bytes(f.planned.prediction.peak_bytes) : "-",
                               f.planned.feasible ? fixed(seq * f.predicted_samples_per_second, 0) : "-",
                               f.unchecked_fits ? "yes" : "no",
                               f.unchecked_fits ? fixed(seq * f.unchecked_samples_per_second, 0) : "-"};
    nlohmann::json entry = {
        {"micro_batch", f.micro_batch},
        {"accumulation", f.accumulation},
        {"feasible", f.planned.feasible},
        {"plan", f.planned.feasible ? nlohmann::json(f.planned.plan.to_string()) : nlohmann::json()},
        {"predicted_peak_bytes", f.planned.prediction.peak_bytes},
        {"predicted_tokens_per_second", seq * f.predicted_samples_per_second},
        {"unchecked_fits", f.unchecked_fits},
        {"unchecked_predicted_tokens_per_second", seq * f.unchecked_samples_per_second}};
    if (measured) {
      const MeasuredMicroBatch* m = nullptr;
      for (const auto& r : row.measured) m = r.micro_batch == f.micro_batch ? &r : m;
      const bool over = m && m->planned.activation_peak_bytes > c.budget_bytes;
      cells.push_back(m ? format_bytes(m->planned.activation_peak_bytes) + (over ? " OVER" : "") : "-");
      cells.push_back(m ? fixed(seq * m->samples_per_second, 0) : "-");
      cells.push_back(m && m->unchecked ? fixed(seq * m->unchecked_samples_per_second, 0) : "-");
      if (m) {
        entry["measured_peak_bytes"] = m->planned.activation_peak_bytes;
        entry["measured_tokens_per_second"] = seq * m->samples_per_second;
        if (m->unchecked) entry["unchecked_measured_tokens_per_second"] = seq * m->unchecked_samples_per_second;
      }
    }
    table.add_row(cells);
    frontier.push_back(entry);
  }
  table.print(out);
  auto line = [&](const char* what, std::optional<size_t> index, bool unchecked) {
    out << "  " << what << ": ";
    if (!index) {
      out << "nothing fits\n";
      return;
    }
    const MicroBatchChoice& f = c.frontier[*index];
    out << "micro-batch " << f.micro_batch << " x " << f.accumulation << ", "
        << fixed(tokens_per_second(row, index, unchecked, sequence), 0) << " tokens/s"
        << (measured ? " measured" : " predicted") << "\n";
  };
  line("chosen (* above)", c.best, false);
  line("no checkpointing, largest micro-batch that fits", c.largest_unchecked, true);
  line("whole batch, optimal plan", c.whole_batch, false);
  return {{"budget", row.budget},
          {"budget_bytes", c.budget_bytes},
          {"unchecked_peak_bytes", c.unchecked_peak_bytes},
          {"chosen_micro_batch", c.best ? nlohmann::json(c.frontier[*c.best].micro_batch) : nlohmann::json()},
          {"chosen_tokens_per_second", tokens_per_second(row, c.best, false, sequence)},
          {"largest_unchecked_tokens_per_second", tokens_per_second(row, c.largest_unchecked, true, sequence)},
          {"whole_batch_tokens_per_second", tokens_per_second(row, c.whole_batch, false, sequence)},
          {"frontier", frontier}};
}

void run_throughput_plan(PlanFlags& flags) {
  const auto& options = flags.model.options;
  options.model.validate();
  REMAT_CHECK(flags.planning.profile_file.empty(),
              "--maximize throughput profiles the model at several batch sizes itself; ", "drop --profile.");
  const std::vector<std::string> budgets = budget_list(flags.budgets);
  REMAT_CHECK(!budgets.empty(), "--maximize throughput: give at least one --budget, as in --budget 50%.");
  std::ostream& out = human_output(flags.json);
  SampleModel sample = make_sample_model(options);
  const std::vector<int64_t> sizes = default_profile_batches(options.batch);
  out << "profiling the GPT (" << options.model.describe() << ") at batch sizes";
  for (const int64_t b : sizes) out << " " << b;
  out << "...\n";
  const ProfiledBatches profiled = models::profile_gpt_batches(
      sample.model, sample.tokens, sample.targets, sizes, PlanningOptions().profile().repeats(flags.planning.repeats),
      flags.model.checkpoint_mode);
  out << "profiles on one clock (each unchecked step measured in one interleaved series): times scaled by";
  for (size_t i = 0; i < profiled.tables.size(); ++i) {
    out << (i ? ", " : " ") << fixed(profiled.time_scales[i], 2) << " at batch " << profiled.tables[i].first;
  }
  out << "\n";
  const InterpolationCheck check = check_interpolation(profiled.tables);
  if (check.worst_batch > 0) {
    out << "linear law check: batch " << check.worst_batch << " predicted from the profiles around it: unchecked peak "
        << percent(check.peak_error) << " off, step " << percent(check.step_error) << " off\n";
  }
  const int64_t sequence = options.model.sequence();
  nlohmann::json results = nlohmann::json::array();
  std::vector<ThroughputPoint> points;
  for (const auto& text : budgets) {
    ThroughputRow row{
        text,
        plan_throughput(profiled.costs_at(), options.batch, Budget::parse(text),
                        ThroughputOptions().planner(
                            PlannerOptions().mode(flags.model.checkpoint_mode).memory_slots(flags.planning.slots))),
        {}};
    if (flags.measure) {
      out << "measuring the frontier at budget " << text << ", " << flags.measure_steps
          << " interleaved steps per plan...\n";
      row.measured = measure_frontier(row.choice, [&](const std::vector<MicroBatchRun>& runs) {
        return models::gpt_measure_micro_batches(sample.model, runs, sample.tokens, sample.targets,
                                                 flags.measure_steps);
      });
    }
    results.push_back(print_throughput_row(row, sequence, out));
    const ThroughputChoice& c = row.choice;
    points.push_back({100.0 * static_cast<double>(c.budget_bytes) / static_cast<double>(c.unchecked_peak_bytes), text,
                      tokens_per_second(row, c.best, false, sequence),
                      tokens_per_second(row, c.largest_unchecked, true, sequence),
                      tokens_per_second(row, c.whole_batch, false, sequence)});
  }
  if (!flags.plot_dir.empty()) {
    std::filesystem::create_directories(flags.plot_dir);
    std::sort(points.begin(), points.end(),
              [](const auto& a, const auto& b) { return a.budget_percent < b.budget_percent; });
    const auto files =
        plot_throughput(flags.plot_dir,
                        "GPT " + options.model.describe() + ", global batch " + std::to_string(options.batch) +
                            (flags.measure ? ", measured" : ", predicted"),
                        points);
    for (const auto& f : files) out << "wrote " << f << "\n";
  }
  if (flags.json) std::cout << nlohmann::json{{"results", results}}.dump(2) << "\n";
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto flags = std::make_shared<PlanFlags>();
  CLI::App* plan = app.add_subcommand("plan", "The plan of a policy, or the fastest plan under memory budgets");
  flags->model.add_to(*plan, ModelUse::run,
                      "Text file to take the profiled batch from, instead of the fortunes corpus");
  plan->add_option("--policy", flags->policy, "Show this policy's plan (see `remat policies`)")->group("Planning");
  add_budget_option(*plan, flags->budgets, "Plan for each of these activation budgets");
  flags->planning.add_to(*plan);
  add_checkpoint_mode_option(
      *plan, flags->model.checkpoint_mode,
      "How the plan's segments are checkpointed: reentrant, non-reentrant (the planner counts what each holds)");
  plan->add_flag("--measure", flags->measure, "Run the plans and every manual policy, and compare with the predictions")
      ->group("Measurement");
  add_measure_steps_option(*plan, flags->measure_steps, "Measured interleaved steps per plan for --measure");
  plan->add_flag("--verify", flags->verify,
                 "Run one step unchecked (same stage options) and one under each plan from the same RNG state; print "
                 "max |gradient difference|")
      ->group("Measurement");
  plan->add_option("--maximize", flags->maximize,
                   "With --budget: choose the micro-batch (gradient accumulation to --batch) with the plan, for the "
                   "most tokens per second")
      ->check(CLI::IsMember({"throughput"}))
      ->group("Planning");
  plan->add_option("--plot", flags->plot_dir,
                   "With --maximize throughput: write tokens/s vs budget plots to this folder")
      ->group("Output");
  plan->add_flag(
          "!--no-verify-fit", flags->verify_fit,
          "Trust the predicted peak: do not run each budget's plan once to check it fits (and plan again if not)")
      ->group("Planning");
  plan->add_option("--save-plan", flags->save_file, "Write the plan as JSON to this file (for `remat train --plan`)")
      ->group("Output");
  add_json_flag(*plan, flags->json);
  plan->callback([flags] {
    flags->model.apply_preset();
    refuse_output_over_input({{"--profile", flags->planning.profile_file}, {"--data", flags->model.options.data_file}},
                             "--save-plan", flags->save_file);
    flags->model.refuse_together("--policy", "--budget");
    REMAT_CHECK(flags->maximize.empty() || !flags->budgets.empty(),
                "--maximize throughput needs --budget: the micro-batch is chosen for the most throughput under it.");
    REMAT_CHECK(flags->plot_dir.empty() || !flags->maximize.empty(),
                "--plot draws the throughput frontier: give it with ",
                "--maximize throughput (`remat bench --plot` draws the memory-time plots).");
    if (flags->budgets.empty()) {
      REMAT_CHECK(flags->planning.profile_file.empty(),
                  "--profile has no effect with --policy: a policy's plan needs no profile ",
                  "(the planner plans from one for --budget). Drop --profile, or give --budget.");
      run_policy_plan(*flags);
    } else if (!flags->maximize.empty()) {
      run_throughput_plan(*flags);
    } else {
      run_budget_plan(*flags);
    }
  });
}

}  // namespace remat::cli
