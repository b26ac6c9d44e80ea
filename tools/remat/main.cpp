// The `remat` command-line program: one subcommand per job.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <iostream>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include "commands.h"
#include "invocation.h"
#include "model_flags.h"
#include "remat/base/error.h"
#include "remat/memory/memory.h"
#include "remat/base/threads.h"
#include "remat/memory/memory.h"

namespace {

// The library's errors name the fields a library caller sets (GptConfig::heads); a command-line user
// set flags, so their messages name those instead: the fields are the error's data (FieldError).
std::string flag_of(const std::string& field) {
  static const std::map<std::string, std::string> flags = {
      {"GptConfig::layers", "--layers"},
      {"GptConfig::hidden", "--hidden"},
      {"GptConfig::heads", "--heads"},
      {"GptConfig::sequence", "--seq"},
      {"GptConfig::dropout", "--dropout"},
      {"GptConfig::vocabulary", "--vocab"},
      {"TrainOptions::batch", "--batch"},
      {"batch", "--batch"},
      {"TrainOptions::lr", "--lr"},
      {"TrainOptions::warmup_steps", "--warmup"},
      {"TrainOptions::steps", "--steps"},
      {"TrainOptions::threads", "--threads"},
      {"TrainOptions::data_file", "--data"},
      {"PlanRequest::of_budget", "--budget"},
      {"TrainOptions::resume_dir", "--resume"},
      {"TrainOptions::save_dir", "--save-state"},
      {"TrainOptions::save_every", "--save-every"},
      {"TrainOptions::keep_last", "--keep-last"},
      {"ProfileOptions::repeats", "--repeats"},
      {"TrainOptions::micro_batch", "--micro-batch"},
      {"TrainOptions::lengths", "--lengths"},
      {"TrainOptions::maximize_throughput", "--maximize throughput"},
      {"TrainOptions::plan_over_graph", "--planner graph"}};
  const auto it = flags.find(field);
  return it == flags.end() ? field : it->second;
}

// What an error shows on the terminal: everything a terminal could act on escaped
// (remat::escape_unprintable: control bytes, C1 controls, bytes that are not valid UTF-8), line
// breaks kept, and any run of more than 120 characters without a blank (a 100 kB argument a
// message quotes) cut to its first 100.
std::string for_terminal(const std::string& message) {
  constexpr size_t kLongest = 120, kShown = 100;
  std::string out;
  size_t i = 0;
  while (i < message.size()) {
    size_t end = i;
    while (end < message.size() && message[end] != ' ' && message[end] != '\n') ++end;
    size_t shown = end - i <= kLongest ? end - i : kShown;
    while (shown < end - i && (static_cast<unsigned char>(message[i + shown]) & 0xC0) == 0x80) --shown;
    out += remat::escape_unprintable(message.substr(i, shown));
    if (shown < end - i) out += "... (" + std::to_string(end - i - shown) + " more characters)";
    if (end < message.size()) out += message[end];
    i = end + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  remat::keep_freed_memory_in_process();
  // c10d logs its retries and bind failures as warnings, dozens of lines before the error that
  // says what went wrong; errors only, unless the user asks LibTorch for more.
  if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) {
    FLAGS_caffe2_log_level = std::max(FLAGS_caffe2_log_level, 2);
  } else {
    c10::initLogging();  // reads TORCH_CPP_LOG_LEVEL, as PyTorch does at import
  }
  remat::cli::record_invocation(argc, argv);
  CLI::App app{"remat: activation checkpointing for LibTorch, measured"};
  app.require_subcommand(1);
  remat::cli::add_train_command(app);
  remat::cli::add_plan_command(app);
  remat::cli::add_policies_command(app);
  remat::cli::add_profile_command(app);
  remat::cli::add_estimate_command(app);
  remat::cli::add_demo_command(app);
  remat::cli::add_bench_command(app);
  remat::cli::add_trace_command(app);
  remat::cli::add_worker_command(app);
  remat::cli::make_numbers_decimal(app);
  // CLI11 would say "A subcommand is required" for `remat frobnicate`: name it and the real ones.
  std::string names;
  bool known = argc < 2 || argv[1][0] == '-';
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
    known = known || sub->get_name() == argv[1];
  }
  if (!known) {
    std::cerr << "error: unknown subcommand " << remat::printable(argv[1], 40) << "; the subcommands are " << names
              << " (remat SUBCOMMAND --help for each).\n";
    return 1;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help: CLI11 prints it
    std::cerr << for_terminal(e.what()) << "\nRun with --help for more information.\n";
    return e.get_exit_code();
  } catch (const remat::FieldError& e) {
    std::cerr << "error: " << for_terminal(e.message_naming(flag_of)) << "\n";
    return 1;
  } catch (const c10::Error& e) {
    std::cerr << "error: " << for_terminal(e.what_without_backtrace()) << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << for_terminal(e.what()) << "\n";
    return 1;
  }
  return 0;
}
