// `remat train`: train the GPT on real text under a checkpointing policy or plan, and report
// what it cost.
#include "train_command.h"

#include <algorithm>
#include <iostream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "model_flags.h"
#include "planning.h"
#include "remat/statistics.h"
#include "remat/error.h"
#include "remat/train/trainer.h"
#include "table.h"

namespace remat::cli {
namespace {

struct TrainFlags {
  ModelFlags model;
  bool verify = false;
  std::string save_dir;
  bool compare = false;
  bool json = false;
  int64_t sample_bytes = 200;
  int compare_steps = 3;
};

std::string printable(const std::string& text) {
  std::string out;
  for (char c : text) out += (c == '\n' || c == '\t' || (c >= 32 && c < 127)) ? c : '?';
  return out;
}

void run_train(TrainFlags& flags) {
  flags.model.apply_preset();
  if (!flags.model.options.budget.empty()) {
    (flags.json ? std::cerr : std::cout) << "profiling for --budget " << flags.model.options.budget << "...\n";
  }
  // With a budget, the trainer profiles its model and plans; every input is checked first.
  train::Trainer trainer(flags.model.options);
  const auto& o = trainer.options();
  std::ostream& out = flags.json ? std::cerr : std::cout;  // with --json, stdout holds only the JSON
  const bool terminal = isatty(STDERR_FILENO) != 0;

  out << "remat train: GPT " << o.model.describe() << "; batch " << o.batch << ", lr " << o.lr << " (warm-up "
      << o.warmup_steps << "), " << trainer.threads_description() << ", seed " << o.seed << "\n"
      << "  corpus: " << trainer.corpus().source() << ", " << trainer.corpus().bytes().size() << " bytes\n"
      << "  plan (" << trainer.plan_source() << "): " << trainer.plan().to_string() << "\n";
  if (trainer.global_step() > 0) out << "  resumed at step " << trainer.global_step() << "\n";
  nlohmann::json verification;
  if (flags.verify) {
    const PlanVerification v = trainer.verify();
    out << "  verify: " << v.to_string();
    verification = {{"bitwise_equal", v.bitwise_equal()}, {"max_gradient_difference", v.max_gradient_difference()},
                    {"max_buffer_difference", v.max_buffer_difference()},
                    {"output_difference", v.output_max_abs_difference}};
  }

  std::vector<train::StepRecord> records;
  const int64_t report_every = std::max<int64_t>(1, o.steps / 10);
  for (int64_t i = 0; i < o.steps; ++i) {
    records.push_back(trainer.step());
    const auto& r = records.back();
    const double tokens_per_second = static_cast<double>(r.tokens) / r.seconds;
    if (terminal) {
      const int width = 24, filled = static_cast<int>(width * (i + 1) / o.steps);
      std::cerr << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] step " << r.step
                << " loss " << fixed(r.loss, 3) << "  " << fixed(tokens_per_second, 0) << " tok/s  activation peak "
                << mib(r.activation_peak_bytes) << " MiB   " << std::flush;
    } else if ((i + 1) % report_every == 0 || i == 0) {
      out << "step " << r.step << " loss " << fixed(r.loss, 4) << " " << fixed(tokens_per_second, 0)
          << " tok/s activation peak " << mib(r.activation_peak_bytes) << " MiB\n";
    }
  }
  if (terminal && o.steps > 0) std::cerr << "\n";

  if (!flags.save_dir.empty()) {
    trainer.save(flags.save_dir);
    out << "saved step " << trainer.global_step() << " to " << flags.save_dir << "\n";
  }

  // Step 1 pays one-time allocations (gradients, optimiser state): figures start at step 2.
  std::vector<double> seconds;
  int64_t peak = 0;
  for (size_t i = records.size() > 1 ? 1 : 0; i < records.size(); ++i) {
    seconds.push_back(records[i].seconds);
    peak = std::max(peak, records[i].activation_peak_bytes);
  }
  nlohmann::json report = {{"policy", trainer.plan_source()}, {"plan", trainer.plan().to_string()},
                           {"steps", records.size()}, {"activation_peak_bytes", peak},
                           {"step_seconds_median", median(seconds)}};
  std::vector<double> losses;
  for (const auto& r : records) losses.push_back(r.loss);
  report["losses"] = losses;
  if (flags.verify) report["verify"] = verification;
  report["final_loss"] = records.empty() ? nlohmann::json() : nlohmann::json(records.back().loss);
  report["config"] = {{"layers", o.model.layers}, {"hidden", o.model.hidden}, {"heads", o.model.heads},
                      {"seq", o.model.sequence}, {"batch", o.batch}, {"dropout", o.model.dropout}};

  if (!records.empty()) {
    out << "\nloss " << fixed(records.front().loss, 4) << " at step " << records.front().step << " -> "
        << fixed(records.back().loss, 4) << " at step " << records.back().step << "\n";
  }
  Table table({"plan", "activation peak MiB", "step s (median)"});
  table.add_row({trainer.plan_source(), mib(peak), fixed(median(seconds), 3)});
  if (flags.compare) {
    const auto c = trainer.compare(flags.compare_steps);
    table = Table({"plan", "activation peak MiB", "step s (median)", "memory saved", "time vs none"});
    const double saved = 1.0 - static_cast<double>(c.plan_activation_peak_bytes) / c.none_activation_peak_bytes;
    table.add_row({trainer.plan_source(), mib(c.plan_activation_peak_bytes), fixed(c.plan_step_seconds, 3),
                   fixed(100 * saved, 1) + "%", fixed(c.plan_step_seconds / c.none_step_seconds, 2) + "x"});
    table.add_row({"none", mib(c.none_activation_peak_bytes), fixed(c.none_step_seconds, 3), "0.0%", "1.00x"});
    report["compare"] = {{"plan_activation_peak_bytes", c.plan_activation_peak_bytes},
                         {"none_activation_peak_bytes", c.none_activation_peak_bytes},
                         {"plan_step_seconds_median", c.plan_step_seconds},
                         {"none_step_seconds_median", c.none_step_seconds},
                         {"memory_saved_fraction", saved},
                         {"step_time_ratio", c.plan_step_seconds / c.none_step_seconds}};
    out << "compare: " << flags.compare_steps << " interleaved measured steps each on one batch, no update\n";
  }
  table.print(out);
  if (flags.sample_bytes > 0) {
    const std::string text = trainer.sample("The ", flags.sample_bytes, o.seed);
    report["sample"] = text;
    out << "\nsample:\n" << printable(text) << "\n";
  }
  // Generated bytes need not be valid UTF-8: replace what is not rather than fail.
  if (flags.json) std::cout << report.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto flags = std::make_shared<TrainFlags>();
  CLI::App* cmd = app.add_subcommand("train", "Train a GPT on real text under a checkpointing policy or plan");
  flags->model.add_to(*cmd);
  auto& o = flags->model.options;
  cmd->add_option("--steps", o.steps, "Training steps in this run")->capture_default_str()->group("Training");
  cmd->add_option("--lr", o.lr, "Peak learning rate (AdamW)")->capture_default_str()->group("Training");
  cmd->add_option("--warmup", o.warmup_steps, "Linear warm-up steps")->capture_default_str()->group("Training");
  cmd->add_option("--data", o.data_file, "Train on this text file instead of the fortunes corpus")->group("Training");
  cmd->add_option("--policy", o.policy, "Checkpointing policy (see `remat policies`)")->capture_default_str()->group("Memory");
  cmd->add_option("--plan", o.plan_file, "A plan saved as JSON; overrides --policy")->group("Memory");
  cmd->add_option("--budget", o.budget,
                  "Profile, then train under the fastest plan predicted to fit this activation budget "
                  "(bytes, KiB/MiB/GiB, or % of the unchecked peak); overrides --policy")->group("Memory");
  cmd->add_option("--save", flags->save_dir, "Save the state here at the end (atomically)")->group("State");
  cmd->add_option("--resume", o.resume_dir, "Continue from the state saved here")->group("State");
  cmd->add_flag("--compare", flags->compare, "Also measure the unchecked run and print the ratios")->group("Report");
  cmd->add_option("--compare-steps", flags->compare_steps, "Measured steps per plan for --compare")->capture_default_str()
      ->check(CLI::Range(1, 100))->group("Report");
  cmd->add_option("--sample", flags->sample_bytes, "Bytes of generated text to show (0: none)")->capture_default_str()
      ->check(CLI::Range(0, 100000))->group("Report");
  cmd->add_flag("--json", flags->json, "Print one JSON object on stdout (human output goes to stderr)")->group("Report");
  cmd->add_flag("--verify", flags->verify,
                "Before training, run one step plain and one under the plan from the same RNG state and print "
                "the largest gradient difference (0 on CPU)")
      ->group("Report");
  cmd->callback([flags] { run_train(*flags); });
}

}  // namespace remat::cli
