// `remat plan`: a policy's plan, or the fastest plan under one or several memory budgets, with
// every manual policy compared and, with --measure, predictions checked against real steps.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "model_flags.h"
#include "planning.h"
#include "remat/error.h"
#include "remat/files.h"
#include "remat/models/estimator.h"
#include "remat/models/gpt_policies.h"
#include "remat/plan_measurement.h"
#include "remat/train/corpus.h"
#include "table.h"

namespace remat::cli {
namespace {

struct PlanFlags {
  ModelFlags model;
  std::string policy;
  std::vector<std::string> budgets;
  std::string profile_file;
  std::string save_file;
  int repeats = 5;
  int64_t slots = 1000;
  bool json = false;
  bool measure = false;
  int measure_steps = 3;
  bool verify = false;
};

// `--verify`: one step plain and one under `plan` from the same RNG state, on the sample batch.
void print_verification(const train::TrainOptions& options, const Plan& plan, std::ostream& out) {
  SampleModel sample = make_sample_model(options);
  models::GptChain chain(sample.model, plan.granularity);
  chain.set_targets(sample.targets);
  out << "verify: " << verify_plan(chain, plan, sample.tokens).to_string();
}

void run_policy_plan(PlanFlags& flags) {
  const auto& config = flags.model.options.model;
  config.validate();
  const std::string policy = flags.policy.empty() ? "block" : flags.policy;
  const std::string granularity = models::gpt_policy_granularity(policy);
  models::GptChainShape chain(config.layers, granularity);
  Plan plan = models::gpt_policy_plan(policy, chain);
  plan.mode = flags.model.options.checkpoint_mode;
  if (flags.json) {
    std::cout << plan.to_json() << "\n";
  } else {
    std::cout << "policy " << policy << " for a GPT with " << config.describe() << " (" << chain.size()
              << " stages, granularity " << granularity << "):\n  " << plan.to_string() << "\n";
  }
  if (!flags.save_file.empty()) {
    write_file_atomically(flags.save_file, plan.to_json() + "\n");
    if (!flags.json) std::cout << "saved to " << flags.save_file << "\n";
  }
  if (flags.verify) print_verification(flags.model.options, plan, flags.json ? std::cerr : std::cout);
}

void run_budget_plan(PlanFlags& flags) {
  const auto& options = flags.model.options;
  options.model.validate();
  const std::vector<std::string> budgets = budget_list(flags.budgets);
  REMAT_CHECK(!budgets.empty(), "--budget: give at least one budget, as in --budget 50% or --budget 200MiB.");
  std::ostream& out = human_output(flags.json);
  ModelCosts costs;
  if (!flags.profile_file.empty()) {
    costs = load_profile_for(flags.profile_file, options);
  } else {
    out << "profiling the GPT (" << options.model.describe() << ", batch " << options.batch << ")...\n";
    costs = profile_model(options, flags.repeats);
  }
  const int64_t unchecked = costs.unchecked_peak_bytes();
  models::GptChainShape block_chain(options.model.layers, "block");
  const double none_seconds = costs.unchecked().step_seconds;
  out << "unchecked activation peak (predicted): " << format_bytes(unchecked) << ", step " << fixed(none_seconds, 3)
      << " s\n";

  struct BudgetResult {
    std::string text;
    int64_t bytes;
    BudgetPlan optimal;
    std::vector<PlanCandidate> others;
    int64_t least;
    double solve_seconds;
  };
  std::vector<BudgetResult> results;
  for (const auto& text : budgets) {
    BudgetResult r{text, 0, {}, {}, -1, 0};
    const auto start = std::chrono::steady_clock::now();
    r.optimal = models::gpt_plan_for_budget(costs, text, flags.slots, options.checkpoint_mode);
    r.bytes = r.optimal.budget_bytes;
    r.least = r.optimal.min_feasible_budget_bytes;
    r.solve_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.others = models::gpt_compare_planners(costs, r.bytes, flags.slots);
    results.push_back(std::move(r));
  }

  nlohmann::json json_results = nlohmann::json::array();
  for (const auto& r : results) {
    out << "\nbudget " << r.text << " = " << format_bytes(r.bytes) << " (least feasible " << format_bytes(r.least)
        << "; planned in " << fixed(r.solve_seconds * 1e3, 1) << " ms)\n  optimal plan: " << r.optimal.plan.to_string()
        << "\n  predicted activation peak " << format_bytes(r.optimal.prediction.peak_bytes) << ", step "
        << fixed(r.optimal.prediction.step_seconds, 3) << " s, overhead "
        << percent(r.optimal.prediction.step_seconds / none_seconds - 1) << "\n";
    Table table({"strategy", "predicted peak", "fits", "predicted overhead"});
    table.add_row({"optimal", format_bytes(r.optimal.prediction.peak_bytes), "yes",
                   percent(r.optimal.prediction.step_seconds / none_seconds - 1)});
    nlohmann::json policies = nlohmann::json::array();
    for (const auto& o : r.others) {
      const bool has_plan = !o.plan.stage_names.empty();
      table.add_row({o.name, has_plan ? format_bytes(o.prediction.peak_bytes) : "-", o.feasible ? "yes" : "no",
                     has_plan ? percent(o.prediction.step_seconds / none_seconds - 1) : "-"});
      policies.push_back({{"name", o.name}, {"fits", o.feasible},
                          {"predicted_peak_bytes", has_plan ? nlohmann::json(o.prediction.peak_bytes) : nlohmann::json()},
                          {"predicted_overhead", has_plan ? nlohmann::json(o.prediction.step_seconds / none_seconds - 1)
                                                          : nlohmann::json()}});
    }
    table.print(out);
    json_results.push_back({{"budget", r.text}, {"budget_bytes", r.bytes}, {"plan", r.optimal.plan.to_string()},
                            {"plan_json", nlohmann::json::parse(r.optimal.plan.to_json())},
                            {"predicted_peak_bytes", r.optimal.prediction.peak_bytes},
                            {"predicted_step_seconds", r.optimal.prediction.step_seconds},
                            {"predicted_overhead", r.optimal.prediction.step_seconds / none_seconds - 1},
                            {"min_feasible_budget_bytes", r.least}, {"unchecked_peak_bytes", unchecked},
                            {"solve_seconds", r.solve_seconds}, {"policies", policies}});
  }

  if (flags.measure) {
    // One model, one batch; every plan measured in interleaved rounds.
    const SampleModel sample = make_sample_model(options);
    std::vector<Plan> plans = {Plan::plain(block_chain)};
    std::map<std::string, size_t> index;  // by compact form: a plan measured once
    index[plans[0].to_string()] = 0;
    auto add = [&](const Plan& p) {
      const auto key = p.granularity + " " + p.to_string();
      if (index.count(key) == 0) {
        index[key] = plans.size();
        plans.push_back(p);
      }
      return index[key];
    };
    std::vector<size_t> optimal_index;
    std::vector<std::pair<std::string, size_t>> manual;
    std::vector<size_t> manual_index;
    for (const auto& r : results) optimal_index.push_back(add(r.optimal.plan));
    for (const auto& o : results.front().others) {
      if (o.name == "revolve" || o.name == "chen") continue;
      manual.emplace_back(o.name, add(o.plan));
      manual_index.push_back(manual.back().second);
    }
    out << "\nmeasuring " << plans.size() << " plans, " << flags.measure_steps << " interleaved steps each...\n";
    const auto measured = train::measure_plans(sample.model, plans, sample.tokens, sample.targets, flags.measure_steps);
    const double none_measured = measured[0].step_seconds;
    auto overhead = [&](size_t i) { return paired_time_ratio(measured[i], measured[0]) - 1; };  // per round
    Table table({"budget", "optimal: predicted peak", "measured peak", "error", "predicted overhead", "measured overhead",
                 "best manual fitting", "its measured overhead", "optimal <= best"});
    for (size_t b = 0; b < results.size(); ++b) {
      const auto& r = results[b];
      const auto& m = measured[optimal_index[b]];
      const std::optional<size_t> best = fastest_fitting(measured, manual_index, r.bytes, 0);
      std::string best_name = "(none fits)";
      for (const auto& [name, i] : manual) {
        if (best && i == *best) best_name = name;
      }
      const double error = static_cast<double>(r.optimal.prediction.peak_bytes - m.activation_peak_bytes) /
                           static_cast<double>(m.activation_peak_bytes);
      table.add_row({r.text + " (" + format_bytes(r.bytes) + ")", format_bytes(r.optimal.prediction.peak_bytes),
                     format_bytes(m.activation_peak_bytes) + (m.activation_peak_bytes <= r.bytes ? "" : " OVER"),
                     percent(error), percent(r.optimal.prediction.step_seconds / none_seconds - 1),
                     percent(overhead(optimal_index[b])), best_name, best ? percent(overhead(*best)) : "-",
                     !best || paired_time_ratio(m, measured[*best]) <= 1 ? "yes" : "no"});
      json_results[b]["measured_peak_bytes"] = m.activation_peak_bytes;
      json_results[b]["measured_overhead"] = overhead(optimal_index[b]);
      json_results[b]["best_manual"] = best_name;
      json_results[b]["best_manual_measured_overhead"] = best ? nlohmann::json(overhead(*best)) : nlohmann::json();
    }
    table.print(out);
    Table all({"plan", "measured peak", "measured overhead"});
    for (const auto& [name, i] : manual) {
      all.add_row({name, format_bytes(measured[i].activation_peak_bytes), percent(overhead(i))});
    }
    out << "\nmanual policies as measured (unchecked: " << format_bytes(measured[0].activation_peak_bytes) << ", "
        << fixed(none_measured, 3) << " s):\n";
    all.print(out);
  }

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
  if (flags.json) std::cout << (json_results.size() == 1 ? json_results[0] : nlohmann::json{{"results", json_results}}).dump(2) << "\n";
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto flags = std::make_shared<PlanFlags>();
  CLI::App* plan = app.add_subcommand("plan", "The plan of a policy, or the fastest plan under memory budgets");
  flags->model.add_to(*plan, ModelUse::run, "Text file to take the profiled batch from, instead of the fortunes corpus");
  plan->add_option("--policy", flags->policy, "Show this policy's plan (see `remat policies`)")->group("Planning");
  add_budget_option(*plan, flags->budgets, "Plan for each of these activation budgets");
  plan->add_option("--profile", flags->profile_file, "Plan from this profile (`remat profile --save-profile`) instead of profiling")
      ->group("Planning");
  plan->add_option("--repeats", flags->repeats, "Profiling runs per stage (the median is kept)")
      ->capture_default_str()->check(CLI::Range(1, 100))->group("Planning");
  add_checkpoint_mode_option(*plan, flags->model.options.checkpoint_mode,
                             "How the plan's segments are checkpointed: reentrant, non-reentrant (the planner counts what each holds)");
  plan->add_option("--slots", flags->slots, "Memory grid of the planner: budget / slots is its resolution, in bytes")
      ->capture_default_str()->check(CLI::Range(1, 100000))->group("Planning");
  plan->add_flag("--measure", flags->measure, "Run the plans and every manual policy, and compare with the predictions")
      ->group("Measurement");
  add_measure_steps_option(*plan, flags->measure_steps, "Measured interleaved steps per plan for --measure");
  plan->add_flag("--verify", flags->verify,
                 "Run one step unchecked (same stage options) and one under each plan from the same RNG state; print max |gradient difference|")
      ->group("Measurement");
  plan->add_option("--save-plan", flags->save_file, "Write the plan as JSON to this file (for `remat train --plan`)")
      ->group("Output");
  add_old_spelling(*plan, "--save", "--save-plan", flags->save_file);
  add_json_flag(*plan, flags->json);
  plan->callback([flags] {
    flags->model.apply_preset();
    flags->model.refuse_together("--policy", "--budget");
    if (flags->budgets.empty()) {
      run_policy_plan(*flags);
    } else {
      run_budget_plan(*flags);
    }
  });
}

}  // namespace remat::cli
