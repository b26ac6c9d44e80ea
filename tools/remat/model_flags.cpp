#include "model_flags.h"

#include <sys/stat.h>

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
      ->check(whole_number_from(1, 1000000))
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

namespace {

// Decimal digits, an optional '-' first: what a whole number on the command line may be.
bool decimal_digits(const std::string& text) {
  const size_t first = !text.empty() && text[0] == '-' ? 1 : 0;
  return text.size() > first && text.find_first_not_of("0123456789", first) == std::string::npos;
}

// A number in decimal notation: digits with an optional fraction and exponent, an optional '-'
// first; not hexadecimal (0x1p3), inf or nan, which strtod would also read.
bool decimal_notation(const std::string& text) {
  size_t at = !text.empty() && text[0] == '-' ? 1 : 0;
  const auto digits = [&] {
    const size_t start = at;
    while (at < text.size() && text[at] >= '0' && text[at] <= '9') ++at;
    return at - start;
  };
  size_t mantissa = digits();
  if (at < text.size() && text[at] == '.') {
    ++at;
    mantissa += digits();
  }
  if (mantissa == 0) return false;
  if (at < text.size() && (text[at] == 'e' || text[at] == 'E')) {
    ++at;
    if (at < text.size() && (text[at] == '+' || text[at] == '-')) ++at;
    if (digits() == 0) return false;
  }
  return at == text.size();
}

// CLI11 reads integers with strtoll's automatic base (010 is 8, 0x10 is 16) and clamps what is
// beyond int64 (strtoll's ERANGE) to its largest value; this transform, run before any other
// check of the option, makes them decimal: leading zeros dropped (010 is 10), anything but digits
// refused, and a value beyond the type's range (int64, or uint64 for `is_unsigned`) refused with
// the range in words. Narrower ranges are the options' own checks (whole_number_from, Range).
CLI::Validator decimal_whole_number(bool is_unsigned) {
  const std::string range = is_unsigned ? "a whole number from 0 to 18446744073709551615"
                                        : "a whole number from -9223372036854775808 to 9223372036854775807";
  return CLI::Validator(
      [range, is_unsigned](std::string& text) -> std::string {
        const std::string got = ", got " + remat::printable(text, 40);
        if (!decimal_digits(text)) {
          const bool based = text.find_first_of("xXbBoO") != std::string::npos;
          return range + " in decimal digits" + got + (based ? " (hexadecimal, octal and binary are not read)" : "");
        }
        const bool negative = text[0] == '-';
        std::string digits = text.substr(negative ? 1 : 0);
        digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size() - 1));  // 010 is ten
        const bool zero = digits == "0";
        const std::string most = is_unsigned ? "18446744073709551615"
                                 : negative  ? "9223372036854775808"
                                             : "9223372036854775807";
        const bool out_of_range = (negative && !zero && is_unsigned) || digits.size() > most.size() ||
                                  (digits.size() == most.size() && digits > most);
        if (out_of_range) return range + got;
        text = (negative && !zero ? "-" : "") + digits;
        return std::string();
      },
      "", "");
}

// The same for a real number: decimal notation only, refused otherwise.
CLI::Validator decimal_real_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (decimal_notation(text)) return std::string();
        return "a number in decimal notation (like 3, 0.5 or 3e-4), got " + remat::printable(text, 40);
      },
      "", "");
}

void make_numbers_decimal_in(CLI::App& command) {
  for (CLI::Option* option : command.get_options()) {
    if (option->get_type_size_max() == 0) continue;  // a flag
    const std::string type = option->get_type_name().substr(0, option->get_type_name().find(':'));
    if (type == "INT" || type == "UINT") {
      option->transform(decimal_whole_number(type == "UINT"));
    } else if (type == "FLOAT") {
      option->transform(decimal_real_number());
    }
  }
  for (CLI::App* sub : command.get_subcommands([](CLI::App*) { return true; })) make_numbers_decimal_in(*sub);
}

}  // namespace

void make_numbers_decimal(CLI::App& app) { make_numbers_decimal_in(app); }

void refuse_output_over_input(const std::vector<std::pair<std::string, std::string>>& inputs,
                              const std::string& output_flag, const std::string& output) {
  struct stat written {};
  if (output.empty() || ::stat(output.c_str(), &written) != 0) return;  // not there yet: no input's
  for (const auto& [flag, input] : inputs) {
    struct stat read {};
    if (input.empty() || ::stat(input.c_str(), &read) != 0) continue;
    REMAT_CHECK(read.st_dev != written.st_dev || read.st_ino != written.st_ino, output_flag, " ",
                remat::printable(output, 80), " is the file that ", flag, " ", remat::printable(input, 80),
                " reads: writing it would replace that input. Give ", output_flag, " another file.");
  }
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

void PlanningFlags::add_to(CLI::App& command, bool plans) {
  if (plans) {
    command
        .add_option("--profile", profile_file,
                    "Plan from this profile (`remat profile --save-profile`) instead of profiling")
        ->group("Planning");
  }
  command.add_option("--repeats", repeats, "Profiling runs per stage, at least (the median is kept)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100))
      ->group("Planning");
  if (plans) {
    command.add_option("--slots", slots, "Memory grid of the planner: budget / slots is its resolution, in bytes")
        ->capture_default_str()
        ->check(CLI::Range(1, 100000))
        ->group("Planning");
  }
}

CLI::Option* add_json_flag(CLI::App& command, bool& json) {
  return command.add_flag("--json", json, "Write one JSON document on stdout; progress and human output go to stderr")
      ->group("Output");
}

std::vector<int64_t> parse_lengths(const std::string& text) {
  const auto number = [&](const std::string& part) {
    size_t used = 0;
    int64_t value = 0;
    try {
      value = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    REMAT_CHECK(used == part.size() && !part.empty() && value >= 1 && value <= (int64_t{1} << 24), "--lengths: '", part,
                "' in '", text, "' is not a length; give MIN:MAX:STEP (64:512:64) or a list (64,128,512).");
    return value;
  };
  std::vector<std::string> parts;
  const char separator = text.find(':') != std::string::npos ? ':' : ',';
  for (size_t at = 0;;) {
    const size_t end = text.find(separator, at);
    parts.push_back(text.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  std::vector<int64_t> lengths;
  if (separator == ',') {
    REMAT_CHECK(parts.size() <= 4096, "--lengths: ", parts.size(), " lengths; give at most 4096.");
    for (const auto& part : parts) lengths.push_back(number(part));
    return lengths;
  }
  REMAT_CHECK(parts.size() == 2 || parts.size() == 3, "--lengths: '", text,
              "' is not MIN:MAX or MIN:MAX:STEP (64:512:64).");
  const int64_t least = number(parts[0]), most = number(parts[1]), step = parts.size() == 3 ? number(parts[2]) : 64;
  REMAT_CHECK(least <= most, "--lengths: '", text, "' runs from ", least, " down to ", most, "; give MIN <= MAX.");
  REMAT_CHECK((most - least) / step < 4096, "--lengths: '", text,
              "' gives more than 4096 lengths; take a larger step.");
  for (int64_t length = least; length <= most; length += step) lengths.push_back(length);
  return lengths;
}

}  // namespace remat::cli
