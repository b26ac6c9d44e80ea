// What the planning reports show for their model, in one place: at each budget, the optimal
// plan's predicted and measured activation peak and step-time overhead, beside the fastest generic
// policy that fits (all measured in interleaved rounds), whether its gradients equal the unchecked
// run's, and a few training steps under the plan against the unchecked run (parameters, buffers).
// Returns how many checks failed; times are printed, never checked.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "remat/base/error.h"
#include "autoplan/verified_plan.h"
#include "remat/autoplan/make_plan.h"
#include "remat/measure/plan_comparison.h"
#include "remat/memory/memory.h"
#include "remat/measure/plan_measurement.h"
#include "remat/chain/policies.h"
#include "remat/measure/profiler.h"
#include "remat/chain/sequential_chain.h"

namespace remat_reports {

// The reports print with what a user's program has at hand; remat's own report tables are the
// project's internal helpers, not part of the installed library.
inline std::string percent(double fraction) {
  std::ostringstream out;
  out << std::showpos << std::fixed << std::setprecision(1) << 100.0 * fraction << "%";
  return out.str();
}

// Columns as wide as their widest cell, left-aligned, two spaces apart.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header) : rows_{std::move(header)} {}
  void add_row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  /// Columns of numbers align right, columns of words left; a rule under the header.
  void print(std::ostream& out) const {
    const size_t n = rows_.front().size();
    std::vector<size_t> widths(n, 0);
    std::vector<bool> left(n, false);
    for (size_t r = 0; r < rows_.size(); ++r) {
      for (size_t i = 0; i < rows_[r].size() && i < n; ++i) {
        const std::string& cell = rows_[r][i];
        widths[i] = std::max(widths[i], cell.size());
        const char first = cell.empty() ? '0' : cell[0];
        if (r > 0 && !(std::isdigit(static_cast<unsigned char>(first)) || first == '+' || first == '-')) left[i] = true;
      }
    }
    size_t total = 0;
    for (size_t w : widths) total += w + 2;
    for (size_t r = 0; r < rows_.size(); ++r) {
      std::string line;
      for (size_t i = 0; i < rows_[r].size() && i < n; ++i) {
        const std::string& cell = rows_[r][i];
        const std::string pad(widths[i] - cell.size(), ' ');
        line += (i ? "  " : "") + (left[i] ? cell + pad : pad + cell);
      }
      out << line.erase(line.find_last_not_of(' ') + 1) << "\n";
      if (r == 0) out << std::string(total - 2, '-') << "\n";
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

struct ReportOptions {
  std::vector<std::string> budgets = {"30%", "50%", "70%"};
  int measured_steps = 7;  // interleaved rounds per plan
  int profile_repeats = 3;
  int train_steps = 3;    // plain vs planned, for parameters and buffers
  int choice_steps = 11;  // the measured choice's interleaved steps (choose_by_measurement)
  bool quick = false;     // the tests' run: no extra profiling rounds for noisy stages
  std::string train_budget = "50%";
};

/// "0.97 [0.95, 1.00] <=": the chosen plan's paired step-time ratio to the best generic policy with
/// its interval; "<=" no slower, "~" slower by less than the spread, ">" slower beyond it.
inline std::string ratio_text(double ratio, double low, double high) {
  char text[64];
  std::snprintf(text, sizeof text, "%.2f [%.2f, %.2f] %s", ratio, low, high,
                ratio <= 1.0 ? "<="
                : low <= 1.0 ? "~"
                             : ">");
  return text;
}

/// "+12.3% ± 1.4"
inline std::string overhead_text(double overhead, double spread) {
  char text[48];
  std::snprintf(text, sizeof text, "%+.1f%% ± %.1f", 100 * overhead, 100 * spread);
  return text;
}

/// "+12.3% [10.1, 14.0]"
inline std::string interval_text(double overhead, double low, double high) {
  char text[64];
  std::snprintf(text, sizeof text, "%+.1f%% [%+.1f, %+.1f]", 100 * overhead, 100 * low, 100 * high);
  return text;
}

/// A fresh model (the memory tracker installed first, so that its allocations count too), its chain
/// and its measured cost table.
struct ProfiledModel {
  ProfiledModel(const std::function<torch::nn::Sequential()>& make_model, const remat::LossFunction& loss_of,
                const at::Tensor& x, const ReportOptions& options)
      : net(tracked(make_model)),
        chain(net, loss_of),
        costs(remat::profile_chain(chain, x, profile_options(options))) {}
  torch::nn::Sequential net;
  remat::SequentialChain chain;
  remat::CostTable costs;

 private:
  static remat::ProfileOptions profile_options(const ReportOptions& options) {
    auto profile = remat::PlanningOptions().profile().repeats(options.profile_repeats);
    return options.quick ? profile.stage_seconds(0).in_step_seconds(0) : profile;
  }
  static torch::nn::Sequential tracked(const std::function<torch::nn::Sequential()>& make_model) {
    remat::install_cpu_memory_tracker();
    return make_model();
  }
};

/// The table as a profile without the generic selective option would have it.
inline remat::CostTable without_sac_option(remat::CostTable costs) {
  for (auto& stage : costs.stages) {
    auto& options = stage.options;
    options.erase(std::remove_if(options.begin() + 1, options.end(),
                                 [](const remat::StageOptionCost& o) { return o.option == remat::kSacOption; }),
                  options.end());
  }
  return costs;
}

/// `make_model` builds the model afresh, identically each time (it seeds); `loss_of` turns its
/// output into the loss. `x` is the batch every step runs on. Each budget is planned with the
/// generic selective option ("sac") offered and without it, both measured in the same series.
inline int report_budgets(const std::function<torch::nn::Sequential()>& make_model, const remat::LossFunction& loss_of,
                          const at::Tensor& x, const ReportOptions& options) {
  int failures = 0;
  ProfiledModel model(make_model, loss_of, x, options);
  remat::SequentialChain& chain = model.chain;
  const remat::CostTable& costs = model.costs;
  const remat::Plan plain = remat::Plan::unchecked(chain);
  std::cout << "measured cost table (" << costs.source << "):\n" << costs.to_table();
  std::cout << "this program's threads: " << remat::cpu_threads() << "\n";
  std::cout << chain.size() << " stages; least feasible budget "
            << remat::format_bytes(remat::least_feasible_budget(costs)) << "\n";

  // Every plan measured once, interleaved: the unchecked one, each budget's optimal plan, and every
  // generic policy (the manual choices a user would otherwise make); overheads paired per round.
  // Each budget's plan verified to fit: run once, planned again below the budget if it passes it.
  // A share ("50%") is of the unchecked step's measured peak, as make_plan takes it; measured
  // once for every budget.
  const int64_t unchecked_measured = remat::measure_plan_peak(chain, plain, x);
  const auto verified = [&](const remat::CostTable& table, const std::string& budget) {
    return remat::plan_verified(chain, table, x, remat::Budget(budget), {}, remat::kDefaultMaxReplans,
                                unchecked_measured);
  };
  // Then the measured choice, as make_plan makes it: timed against the rules of thumb the
  // cost model cannot separate from it, the fastest that fits kept. A budget no plan fits is told,
  // with the least that fits, and left out of the comparison.
  const auto choice =
      remat::MeasuredChoiceOptions().when(remat::ChooseByMeasurement::always).steps(options.choice_steps);
  std::vector<remat::PlanResult> optimal;
  std::vector<std::string> budget_names;
  int64_t least_fitting = -1;
  for (const auto& budget : options.budgets) {
    remat::PlanResult planned = verified(costs, budget);
    if (!planned.feasible) {
      least_fitting = planned.least_feasible_budget_bytes;
      std::cout << "budget " << budget << " (" << remat::format_bytes(planned.budget_bytes)
                << "): no plan measured within it; the least-memory plan measured "
                << remat::format_bytes(planned.least_feasible_budget_bytes) << ", "
                << std::round(1000.0 * static_cast<double>(planned.least_feasible_budget_bytes) /
                              static_cast<double>(unchecked_measured)) /
                       10.0
                << "% of the measured unchecked peak\n";
      continue;
    }
    optimal.push_back(remat::choose_by_measurement(chain, costs, std::move(planned), x, choice));
    budget_names.push_back(budget);
  }
  REMAT_CHECK(!optimal.empty(), "none of the budgets has a plan that fits: give one of at least ",
              remat::format_bytes(least_fitting), ".");
  // The same budgets planned without the generic option: measured in the same series, after them.
  const remat::CostTable costs_without = without_sac_option(costs);
  const size_t budget_count = optimal.size();
  for (const auto& budget : budget_names) optimal.push_back(verified(costs_without, budget).ensure_feasible());
  std::vector<remat::NamedPlan> policies;
  for (const auto& policy : remat::generic_policy_candidates()) {
    try {
      policies.push_back({policy, remat::policy_plan(policy, chain)});
    } catch (const c10::Error&) {
      // not applicable to this depth
    }
  }
  const remat::MeasuredComparison c =
      remat::compare_measured(plain, optimal, policies, [&](const std::vector<remat::Plan>& plans) {
        std::cout << "measuring " << plans.size() << " plans, " << options.measured_steps
                  << " interleaved steps each...\n";
        return remat::measure_plans(chain, plans, x, options.measured_steps);
      });
  const remat::PlanMeasurement& none = c.unchecked.measured;
  const auto none_peak = static_cast<double>(none.activation_peak_bytes);
  std::cout << "unchecked: predicted peak " << remat::format_bytes(optimal.front().unchecked.peak_bytes)
            << ", measured " << remat::format_bytes(none.activation_peak_bytes) << "; step predicted "
            << optimal.front().unchecked.step_seconds << " s, measured " << none.step_seconds << " s\n\n";

  std::cout << "steps measured under " << none.threads << "\n";
  TextTable budgets({"budget", "predicted", "measured", "error", "re-plans", "chosen", "pred. ovh", "meas. ovh [95%]",
                     "in spread", "sac", "without sac: measured", "meas. ovh", "best generic that fits", "its ovh",
                     "chosen/it [95%]", "gradients"});
  for (size_t b = 0; b < budget_count; ++b) {
    const remat::BudgetComparison& bc = c.budgets[b];
    const remat::PlanResult& p = bc.optimal;
    const remat::PlanMeasurement& m = bc.measured.measured;
    const std::string best_name = bc.best_policy ? c.policies[*bc.best_policy].name : "(none fits)";
    const remat::BudgetComparison& w = c.budgets[budget_count + b];  // the same budget planned without sac
    failures += w.fits ? 0 : 1;
    const bool sac_chosen = p.plan.to_string().find(std::string(":") + remat::kSacOption) != std::string::npos;
    // DP against the best generic: paired too, so "<=" means its step was the faster in most rounds.
    const remat::PlanVerification v = remat::verify_plan(chain, p.plan, x);
    failures += bc.fits ? 0 : 1;
    failures += v.bitwise_equal() ? 0 : 1;
    const double error = static_cast<double>(p.prediction.peak_bytes - m.activation_peak_bytes) /
                         static_cast<double>(m.activation_peak_bytes);
    const remat::MeasuredChoice& mc = p.measured_choice;
    budgets.add_row(
        {budget_names[b], remat::format_bytes(p.prediction.peak_bytes),
         remat::format_bytes(m.activation_peak_bytes) + (bc.fits ? "" : "!"), percent(error), std::to_string(p.replans),
         mc.measured && mc.chosen > 0 ? mc.candidates[mc.chosen].name : "DP",
         overhead_text(p.predicted_overhead(), p.predicted_overhead_spread()),
         interval_text(bc.measured.overhead, bc.measured.overhead_low, bc.measured.overhead_high),
         bc.prediction_within_spread ? "yes" : "no", sac_chosen ? "yes" : "no",
         remat::format_bytes(w.measured.measured.activation_peak_bytes) + (w.fits ? "" : "!"),
         percent(w.measured.overhead), best_name, bc.best_policy ? percent(c.policies[*bc.best_policy].overhead) : "-",
         bc.best_policy ? ratio_text(bc.ratio_to_best_policy, bc.ratio_to_best_policy_low, bc.ratio_to_best_policy_high)
                        : "-",
         v.bitwise_equal() ? "bitwise equal" : "DIFFER " + std::to_string(v.max_gradient_difference())});
  }
  budgets.print(std::cout);
  for (size_t b = 0; b < budget_count; ++b) {
    std::cout << "plan at " << budget_names[b] << ": " << c.budgets[b].optimal.plan.to_string() << "\n"
              << "   measured choice: " << c.budgets[b].optimal.measured_choice.reason << "\n"
              << "   without sac: " << c.budgets[budget_count + b].optimal.plan.to_string() << "\n";
  }
  std::cout << "\ngeneric policies (unchecked measured " << remat::format_bytes(none.activation_peak_bytes) << "):\n";
  TextTable generic({"policy", "predicted", "measured", "of none", "pred. ovh", "meas. ovh"});
  const double none_predicted = optimal.front().unchecked.step_seconds;
  for (size_t i = 0; i < policies.size(); ++i) {
    const remat::Prediction predicted = remat::simulate(policies[i].plan, costs);
    const int64_t peak = c.policies[i].measured.activation_peak_bytes;
    generic.add_row({policies[i].name, remat::format_bytes(predicted.peak_bytes), remat::format_bytes(peak),
                     std::to_string(static_cast<int>(100.0 * static_cast<double>(peak) / none_peak)) + "%",
                     percent(predicted.step_seconds / none_predicted - 1), percent(c.policies[i].overhead)});
  }
  generic.print(std::cout);

  // Training: the same steps unchecked and under the plan for `train_budget`, from the same
  // initialisation and RNG seeds: parameters and buffers (running statistics) must match exactly.
  const remat::Plan train_plan = verified(costs, options.train_budget).ensure_feasible().plan;
  std::vector<std::vector<at::Tensor>> finals;
  std::vector<std::vector<double>> losses(2);
  for (int planned = 0; planned < 2; ++planned) {
    torch::nn::Sequential model = make_model();
    remat::SequentialChain model_chain(model, loss_of);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    for (int step = 0; step < options.train_steps; ++step) {
      torch::manual_seed(1000 + step);
      sgd.zero_grad();
      at::Tensor loss = remat::run_plan(model_chain, planned ? train_plan : remat::Plan::unchecked(model_chain), x);
      loss.backward();
      sgd.step();
      losses[planned].push_back(loss.item<double>());
    }
    std::vector<at::Tensor> state;
    for (const auto& p : model->parameters()) state.push_back(p.detach().clone());
    for (const auto& b : model->buffers()) state.push_back(b.clone());
    finals.push_back(std::move(state));
  }
  bool same = losses[0] == losses[1];
  for (size_t i = 0; i < finals[0].size(); ++i) same = same && finals[0][i].equal(finals[1][i]);
  failures += same ? 0 : 1;
  std::cout << "\n"
            << options.train_steps << " SGD steps under the " << options.train_budget << " plan vs unchecked: losses";
  for (double l : losses[1]) std::cout << " " << l;
  std::cout << "; parameters and buffers " << (same ? "bitwise equal" : "DIFFER") << "\n";
  std::cout << (failures == 0 ? "all checks passed" : std::to_string(failures) + " checks FAILED") << "\n";
  return failures == 0 ? 0 : 1;
}

/// Both checkpoint modes side by side, interleaved: `block`, `every:2` and the optimal plan for
/// `options.train_budget` (planned per mode: non-reentrant segments hold no parameter gradients),
/// each reentrant and non-reentrant, with exact peaks, paired overheads and a bitwise check of every
/// plan against the unchecked step.
inline int report_modes(const std::function<torch::nn::Sequential()>& make_model, const remat::LossFunction& loss_of,
                        const at::Tensor& x, const ReportOptions& options) {
  int failures = 0;
  ProfiledModel model(make_model, loss_of, x, options);
  remat::SequentialChain& chain = model.chain;
  const remat::CostTable& costs = model.costs;
  std::vector<remat::Plan> plans = {remat::Plan::unchecked(chain)};
  std::vector<std::string> names = {"none"};
  for (const auto mode : {remat::CheckpointMode::reentrant, remat::CheckpointMode::non_reentrant}) {
    for (const std::string policy : {"block", "every:2"}) {
      plans.push_back(remat::policy_plan(policy, chain));
      plans.back().mode = mode;
      names.push_back(policy);
    }
    plans.push_back(
        remat::plan_verified(chain, costs, x, remat::Budget(options.train_budget), remat::PlannerOptions().mode(mode))
            .ensure_feasible()
            .plan);
    names.push_back("optimal " + options.train_budget);
  }
  std::cout << "measuring " << plans.size() << " plans, " << options.measured_steps << " interleaved steps each...\n";
  const auto measured = remat::measure_plans(chain, plans, x, options.measured_steps);
  TextTable modes({"strategy", "mode", "peak", "predicted", "overhead", "gradients"});
  for (size_t i = 0; i < plans.size(); ++i) {
    const remat::PlanVerification v = remat::verify_plan(chain, plans[i], x);
    failures += v.bitwise_equal() ? 0 : 1;
    const double overhead = i == 0 ? 0.0 : remat::paired_time_ratio(measured[i], measured[0]) - 1;
    modes.add_row({names[i], i == 0 ? "-" : remat::to_string(plans[i].mode),
                   remat::format_bytes(measured[i].activation_peak_bytes),
                   remat::format_bytes(remat::simulate(plans[i], costs).peak_bytes), percent(overhead),
                   v.bitwise_equal() ? "bitwise equal" : "DIFFER"});
  }
  modes.print(std::cout);
  std::cout << "unchecked step " << measured[0].step_seconds << " s (median)\n";
  std::cout << (failures == 0 ? "all checks passed" : std::to_string(failures) + " checks FAILED") << "\n";
  return failures == 0 ? 0 : 1;
}

/// Runs a report's `run`, turning remat's errors into a message and exit status 1.
inline int run_report(int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << "\n";
    return 1;
  }
}

/// The count after `flag`: digits only, 1 to `most`; anything else is refused with what was expected.
inline int64_t count_argument(const std::string& flag, const char* text, int64_t most) {
  const std::string value = text;
  const bool digits = !value.empty() && value.size() <= 9 && value.find_first_not_of("0123456789") == std::string::npos;
  const int64_t count = digits ? std::stoll(value) : 0;
  TORCH_CHECK(count >= 1 && count <= most, flag, " expects a whole number from 1 to ", most, ", got '", value, "'");
  return count;
}

/// Refuses, before anything runs, an argument that is not one of the report's: `switches` stand
/// alone (--quick), `counts` take the next argument as a count (--steps 3). A misspelt flag would
/// otherwise be ignored and the report run as if it had not been given.
inline void check_arguments(int argc, char** argv, const std::vector<std::string>& switches,
                            const std::vector<std::string>& counts) {
  std::string accepted;
  for (const auto& s : switches) accepted += (accepted.empty() ? "" : ", ") + s;
  for (const auto& c : counts) accepted += (accepted.empty() ? "" : ", ") + c + " N";
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    if (std::find(switches.begin(), switches.end(), argument) != switches.end()) continue;
    if (std::find(counts.begin(), counts.end(), argument) != counts.end()) {
      TORCH_CHECK(i + 1 < argc, argument, " expects a whole number after it; the arguments are ", accepted, ".");
      ++i;  // its count, checked where it is read
      continue;
    }
    TORCH_CHECK(false, "unknown argument ", remat::printable(argument, 40), "; the arguments are ", accepted, ".");
  }
}

/// "--quick" anywhere in the arguments: the small configuration the tests run.
inline bool quick_mode(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--quick") return true;
  }
  return false;
}

/// The report's options for the arguments: "--quick" (one measured step, one profiling run) and
/// "--steps N" (measured interleaved steps per plan).
inline ReportOptions report_options(int argc, char** argv) {
  ReportOptions options;
  if (quick_mode(argc, argv)) {
    options.measured_steps = 1;
    options.profile_repeats = 1;
    options.choice_steps = 1;
    options.quick = true;
  }
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--steps")
      options.measured_steps = static_cast<int>(count_argument("--steps", argv[i + 1], 1000));
  }
  return options;
}

}  // namespace remat_reports
