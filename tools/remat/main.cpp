// The `remat` command-line program: one subcommand per job.
#include <iostream>

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include "demo_command.h"
#include "bench_command.h"
#include "estimate_command.h"
#include "invocation.h"
#include "keep_freed_memory.h"
#include "plan_command.h"
#include "train_command.h"
#include "worker_command.h"

int main(int argc, char** argv) {
  remat::cli::keep_freed_memory();
  remat::cli::record_invocation(argc, argv);
  CLI::App app{"remat: activation checkpointing for LibTorch, measured"};
  app.require_subcommand(1);
  remat::cli::add_train_command(app);
  remat::cli::add_plan_commands(app);
  remat::cli::add_estimate_command(app);
  remat::cli::add_demo_command(app);
  remat::cli::add_worker_command(app);
  remat::cli::add_bench_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
