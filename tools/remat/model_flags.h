// The flags every subcommand shares, registered one way everywhere (docs/cli.md lists them):
// the model and its presets, budgets, measured steps, --json, and the old spellings that still
// work with a note on stderr.
#pragma once

#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "remat/autoplan/make_plan.h"
#include "remat/train/trainer.h"

namespace remat::cli {

/// What a command's model flags describe.
enum class ModelUse {
  run,       ///< a GPT built and run here: runnable presets only; --threads, --seed, --data
  estimate,  ///< an analytic estimate: every preset; --vocab, --dtype; no threads, seed or data
  stack,     ///< remat demo's residual stack: layers, hidden, seq, batch, dropout, threads, seed
};

struct ModelFlags {
  train::TrainOptions options;
  /// --checkpoint-mode where a command offers it: how a policy's or budget's plan checkpoints.
  CheckpointMode checkpoint_mode = CheckpointMode::reentrant;
  std::string preset;
  std::string dtype = "fp32";  ///< estimate only
  ModelUse use = ModelUse::run;
  CLI::App* app = nullptr;

  /// Registers --preset --layers --hidden --heads --seq --dropout --batch, and per `use` --threads
  /// --seed --data (run), --vocab --dtype (estimate), --threads --seed (stack).
  void add_to(CLI::App& command, ModelUse model_use, const std::string& data_help = "");
  /// Applies the preset to every flag not given explicitly; errors for a preset this command cannot
  /// run. Called first thing in every command's callback.
  void apply_preset();
  /// Refuses two flags given together, in the same words in every subcommand.
  void refuse_together(const char* first, const char* second) const;
};

/// Refuses, before any work, an output file that is the same file as one of `inputs` (flag, path):
/// the same device and inode, so another spelling, a symbolic link or a hard link to the input is
/// refused too. `remat plan --profile p.json --save-plan p.json` would replace the profile it read.
/// Empty paths and outputs that do not exist yet pass.
void refuse_output_over_input(const std::vector<std::pair<std::string, std::string>>& inputs,
                              const std::string& output_flag, const std::string& output);

/// `--budget B[,B...]` (also repeatable): activation budgets as bytes, KiB/MiB/GiB or % of the
/// unchecked peak. `empty_means_none`: `''`
/// stands for "no budget" (bench's list); otherwise an empty budget is refused, not taken as none.
CLI::Option* add_budget_option(CLI::App& command, std::vector<std::string>& budgets, const std::string& help,
                               bool empty_means_none = false);

/// `--checkpoint-mode reentrant|non-reentrant` straight into `mode` (its current value the default).
CLI::Option* add_checkpoint_mode_option(CLI::App& command, CheckpointMode& mode, const std::string& help);
/// The same, several modes (comma-separated or repeated).
CLI::Option* add_checkpoint_mode_option(CLI::App& command, std::vector<CheckpointMode>& modes, const std::string& help);

/// `--measure-steps N`: measured interleaved rounds, each strategy one step per round.
/// A whole number from `least` to `most`, said in words ("a whole number from 0"; `most` named
/// unless it is int64's largest): CLI11's NonNegativeNumber prints its range as a 309-digit
/// double, and an unsigned flag silently clamps 2^64 to 2^64-1. Out of range is refused.
CLI::Validator whole_number_from(long long least, unsigned long long most = 9223372036854775807ULL);

/// Every numeric option of `app` and its subcommands read in decimal only: CLI11 alone reads 010 as
/// 8, 0x10 as 16 and clamps 99999999999999999999 to int64's largest. Whole numbers: leading zeros
/// dropped (010 is 10), other bases and values beyond the type's range refused with the range in
/// words; real numbers: decimal notation (3, 0.5, 3e-4), not hexadecimal, inf or nan. Called once,
/// after every command has added its options.
void make_numbers_decimal(CLI::App& app);

CLI::Option* add_measure_steps_option(CLI::App& command, int& steps, const std::string& help);

/// The planning flags the commands share, each declared here once with one default, in the
/// "Planning" group: --profile (a saved profile to plan from), --repeats (profiling runs per stage:
/// the library's default) and --slots (the planner's memory grid).
struct PlanningFlags {
  std::string profile_file;
  int repeats = PlanningOptions().profile().repeats();
  int64_t slots = kDefaultMemorySlots;
  /// Registers --repeats, and --profile and --slots where the command plans.
  void add_to(CLI::App& command, bool plans = true);
};

/// `--json`: stdout holds exactly one JSON document; everything else goes to stderr.
CLI::Option* add_json_flag(CLI::App& command, bool& json);

/// Where a command writes what people read: stderr under --json (stdout is the JSON's), else stdout.
inline std::ostream& human_output(bool json) { return json ? std::cerr : std::cout; }

/// `--lengths`: "64:512:64" (from 64 to 512 by 64; the step 64 where left out) or "64,128,512"; at most
/// 4096 lengths, each from 1 to 2^24.
std::vector<int64_t> parse_lengths(const std::string& text);

}  // namespace remat::cli
