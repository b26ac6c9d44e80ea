// The `remat` command-line program: one subcommand per job.
#include <cstring>
#include <map>
#include <iostream>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include "commands.h"
#include "invocation.h"
#include "remat/error.h"
#include "remat/internal/process.h"
#include "remat/memory.h"

namespace {

// The library's errors name the fields a library caller sets (GptConfig::heads); a command-line user
// set flags, so their messages name those instead: the fields are the error's data (FieldError).
std::string flag_of(const std::string& field) {
  static const std::map<std::string, std::string> flags = {
      {"GptConfig::layers", "--layers"}, {"GptConfig::hidden", "--hidden"}, {"GptConfig::heads", "--heads"},
      {"GptConfig::sequence", "--seq"}, {"GptConfig::dropout", "--dropout"}, {"GptConfig::vocabulary", "--vocab"}, {"TrainOptions::batch", "--batch"},
      {"batch", "--batch"}, {"TrainOptions::lr", "--lr"}, {"TrainOptions::warmup_steps", "--warmup"},
      {"TrainOptions::steps", "--steps"}, {"TrainOptions::threads", "--threads"},
      {"TrainOptions::data_file", "--data"}, {"TrainOptions::budget", "--budget"},
      {"TrainOptions::plan_file", "--plan"}, {"TrainOptions::resume_dir", "--resume"},
      {"TrainOptions::save_dir", "--save-state"}, {"TrainOptions::save_every", "--save-every"},
      {"TrainOptions::keep_last", "--keep-last"}, {"TrainOptions::profile_repeats", "--repeats"},
      {"TrainOptions::micro_batch", "--micro-batch"}, {"TrainOptions::maximize_throughput", "--maximize throughput"}};
  const auto it = flags.find(field);
  return it == flags.end() ? field : it->second;
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
  } catch (const remat::FieldError& e) {
    std::cerr << "error: " << e.message_naming(flag_of) << "\n";
    return 1;
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
