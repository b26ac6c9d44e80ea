#include "model_flags.h"

#include <cerrno>
#include <cstdlib>

#include "remat/base/error.h"
#include "remat/train/presets.h"

namespace remat::cli {

void ModelFlags::add_to(CLI::App& command, ModelUse model_use, const std::string& data_help) {
  app = &command;
  use = model_use;
  auto& m = options.model;
  std::string preset_help = "Named configuration; explicit flags override its values:";
  for (const auto& p : train::presets()) {
    if (use == ModelUse::estimate || p.runnable) preset_help += "\n  " + p.name + ": " + p.description;
  }
  command.add_option("--preset", preset, preset_help)->group("Model");
  command.add_option("--layers", m.layers(), "Transformer blocks (residual layers for demo)")
      ->capture_default_str()
      ->group("Model");
  command.add_option("--hidden", m.hidden(), "Hidden size: channels per token")->capture_default_str()->group("Model");
  if (use != ModelUse::stack) {
    command.add_option("--heads", m.heads(), "Attention heads (must divide --hidden)")
        ->capture_default_str()
        ->group("Model");
  }
  command.add_option("--seq", m.sequence(), "Sequence length, tokens (bytes of text)")
      ->capture_default_str()
      ->group("Model");
  command.add_option("--dropout", m.dropout(), "Dropout probability, 0 to 1")->capture_default_str()->group("Model");
  command.add_option("--batch", options.batch, "Sequences per step")->capture_default_str()->group("Model");
  if (use == ModelUse::estimate) {
    command.add_option("--vocab", m.vocabulary(), "Vocabulary size, tokens")->capture_default_str()->group("Model");
    command.add_option("--dtype", dtype, "Activation dtype: fp32, bf16 or fp16")
        ->capture_default_str()
        ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
        ->group("Model");
    return;
  }
  command.add_option("--threads", options.threads, "CPU threads (OpenBLAS's when present, remat/base/threads.h)")
      ->capture_default_str()
      ->group("Machine");
  command.add_option("--seed", options.seed, "Seed of initialisation, dropout and batches")
      ->capture_default_str()
      ->check(whole_number_from(0, ~0ULL).description("SEED"))
      ->group("Machine");
  if (use == ModelUse::run) {
    command
        .add_option("--data", options.data_file,
                    data_help.empty() ? "Text file to take batches from, instead of the fortunes corpus" : data_help)
        ->group("Model");
  }
}

CLI::Validator whole_number_from(long long least, unsigned long long most) {
  constexpr unsigned long long kInt64Max = 9223372036854775807ULL;
  const std::string words = "a whole number from " + std::to_string(least) +
                            (most == kInt64Max ? std::string() : " to " + std::to_string(most));
  return CLI::Validator(
      [least, most, words](std::string& text) -> std::string {
        const std::string got = ", got " + remat::printable(text, 40);
        const bool negative = !text.empty() && text[0] == '-';
        const std::string digits = negative ? text.substr(1) : text;
        if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return words + got;
        errno = 0;
        if (negative) {
          const long long value = std::strtoll(text.c_str(), nullptr, 10);
          return errno == ERANGE || value < least ? words + got : std::string();
        }
        const unsigned long long value = std::strtoull(text.c_str(), nullptr, 10);
        const bool below = least > 0 && value < static_cast<unsigned long long>(least);
        return errno == ERANGE || value > most || below ? words + got : std::string();
      },
      "INT");
}

void ModelFlags::refuse_together(const char* first, const char* second) const {
  auto given = [&](const char* flag) {
    const CLI::Option* option = app->get_option_no_throw(flag);
    return option != nullptr && option->count() > 0;
  };
  REMAT_CHECK(!given(first) || !given(second), "give ", first, " or ", second, ", not both.");
}

void ModelFlags::apply_preset() {
  if (preset.empty()) return;
  const train::Preset& p = train::preset(preset);
  REMAT_CHECK(use == ModelUse::estimate || p.runnable, "--preset ", p.name,
              " is too big to run on this machine; it is for `remat estimate --preset ", p.name, "`.");
  auto set = [&](const char* flag, auto& field, auto value) {
    const CLI::Option* option = app->get_option_no_throw(flag);
    if (option != nullptr && option->count() == 0) field = value;
  };
  auto& m = options.model;
  set("--layers", m.layers(), p.model.layers());
  set("--hidden", m.hidden(), p.model.hidden());
  set("--heads", m.heads(), p.model.heads());
  set("--seq", m.sequence(), p.model.sequence());
  set("--vocab", m.vocabulary(), p.model.vocabulary());
  set("--dropout", m.dropout(), p.model.dropout());
  set("--batch", options.batch, p.batch);
  set("--dtype", dtype, p.dtype);
  if (p.steps) set("--steps", options.steps, *p.steps);
  if (p.lr) set("--lr", options.lr, *p.lr);
  if (p.warmup_steps) set("--warmup", options.warmup_steps, *p.warmup_steps);
}

CLI::Option* add_budget_option(CLI::App& command, std::vector<std::string>& budgets, const std::string& help,
                               bool empty_means_none) {
  CLI::Option* option = command
                            .add_option("--budget", budgets,
                                        help +
                                            " (bytes, KiB/MiB/GiB or % of the unchecked activation peak; "
                                            "several: comma-separated or repeated)")
                            ->delimiter(',')
                            ->group("Planning");
  if (!empty_means_none) {
    option->check(CLI::Validator(
        [](std::string& text) {
          return text.empty() ? std::string("a budget is empty; give bytes, MiB or a percentage") : std::string();
        },
        "BUDGET"));
  }
  return option;
}

namespace {
// A mode's name becomes the enum's number, which CLI11 then stores; parse_checkpoint_mode holds
// the spellings.
CLI::Option* checkpoint_mode_option(CLI::Option* option, const std::string& defaults) {
  const CLI::Validator names(
      [](std::string& text) -> std::string {
        try {
          text = std::to_string(static_cast<int>(parse_checkpoint_mode(text)));
          return "";
        } catch (const c10::Error&) {
          return "'" + text + "' is not a checkpoint mode; use reentrant or non-reentrant";
        }
      },
      "", "");
  return option->transform(names)->type_name("reentrant|non-reentrant")->default_str(defaults)->group("Planning");
}
}  // namespace

CLI::Option* add_checkpoint_mode_option(CLI::App& command, CheckpointMode& mode, const std::string& help) {
  return checkpoint_mode_option(command.add_option("--checkpoint-mode", mode, help), to_string(mode));
}

CLI::Option* add_checkpoint_mode_option(CLI::App& command, std::vector<CheckpointMode>& modes,
                                        const std::string& help) {
  std::string defaults;
  for (const auto mode : modes) defaults += (defaults.empty() ? "" : ",") + std::string(to_string(mode));
  return checkpoint_mode_option(command.add_option("--checkpoint-mode", modes, help), defaults)->delimiter(',');
}

CLI::Option* add_measure_steps_option(CLI::App& command, int& steps, const std::string& help) {
  return command.add_option("--measure-steps", steps, help)
      ->capture_default_str()
      ->check(CLI::Range(1, 1000))
      ->group("Measurement");
}

void add_profile_options(CLI::App& command, std::string& profile_file, int& repeats, int64_t& slots) {
  command
      .add_option("--profile", profile_file,
                  "Plan from this profile (`remat profile --save-profile`) instead of profiling")
      ->group("Planning");
  command.add_option("--repeats", repeats, "Profiling runs per stage (the median is kept)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100))
      ->group("Planning");
  command.add_option("--slots", slots, "Memory grid of the planner: budget / slots is its resolution, in bytes")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000))
      ->group("Planning");
}

CLI::Option* add_json_flag(CLI::App& command, bool& json) {
  return command.add_flag("--json", json, "Write one JSON document on stdout; progress and human output go to stderr")
      ->group("Output");
}

}  // namespace remat::cli
