// The `remat` command-line program: one subcommand per job.
#include <cstring>
#include <iostream>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include "commands.h"
#include "invocation.h"
#include "remat/memory.h"

namespace {

// The library's errors name the fields a library caller set (GptConfig::heads); a command-line user
// set flags, so their messages name those instead.
std::string in_flag_words(std::string message) {
  static const std::pair<const char*, const char*> fields[] = {
      {"GptConfig::layers", "--layers"}, {"GptConfig::hidden", "--hidden"}, {"GptConfig::heads", "--heads"},
      {"GptConfig::sequence", "--seq"}, {"GptConfig::dropout", "--dropout"}, {"TrainOptions::batch", "--batch"},
      {"TrainOptions::lr", "--lr"}, {"TrainOptions::warmup_steps", "--warmup"}, {"TrainOptions::steps", "--steps"},
      {"TrainOptions::threads", "--threads"}, {"TrainOptions::data_file", "--data"},
      {"TrainOptions::budget", "--budget"}, {"TrainOptions::plan_file", "--plan"},
      {"TrainOptions::resume_dir", "--resume"}, {"TrainOptions::save_dir", "--save-state"},
      {"TrainOptions::save_every", "--save-every"}, {"TrainOptions::keep_last", "--keep-last"},
      {"remat: resume:", "remat: --resume:"},
      {"batch x GptConfig", "--batch x GptConfig"}};
  for (const auto& [field, flag] : fields) {
    for (size_t at = message.find(field); at != std::string::npos; at = message.find(field, at + std::strlen(flag))) {
      message.replace(at, std::strlen(field), flag);
    }
  }
  return message;
}

}  // namespace

int main(int argc, char** argv) {
  remat::keep_freed_memory_in_process();
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
  // CLI11 would say "A subcommand is required" for `remat frobnicate`: name it and the real ones.
  std::string names;
  bool known = argc < 2 || argv[1][0] == '-';
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
    known = known || sub->get_name() == argv[1];
  }
  if (!known) {
    const std::string given = std::strlen(argv[1]) > 40 ? std::string(argv[1], 37) + "..." : argv[1];
    std::cerr << "error: unknown subcommand '" << given << "'; the subcommands are " << names
              << " (remat SUBCOMMAND --help for each).\n";
    return 1;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const c10::Error& e) {
    std::cerr << "error: " << in_flag_words(e.what_without_backtrace()) << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
