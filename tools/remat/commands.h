// The `remat` subcommands, one file each (tools/remat/<name>_command.cpp); each registers its
// flags (the shared ones from model_flags.h, listed in docs/cli.md) and its callback.
#pragma once

#include <CLI/CLI.hpp>

namespace remat::cli {

void add_train_command(CLI::App& app);     ///< train the GPT under a policy, plan or budget
void add_plan_command(CLI::App& app);      ///< a policy's plan, or the fastest plan under budgets
void add_policies_command(CLI::App& app);  ///< the checkpointing policies and their trade-offs
void add_profile_command(CLI::App& app);   ///< the GPT's measured per-stage costs
void add_estimate_command(CLI::App& app);  ///< analytic memory and FLOPs of configs too big to run
void add_demo_command(CLI::App& app);      ///< checkpointing a residual stack, measured
void add_bench_command(CLI::App& app);     ///< every strategy measured interleaved, with report and plots
void add_trace_command(CLI::App& app);     ///< activation bytes over one step, per strategy
void add_worker_command(CLI::App& app);    ///< measured steps on request, for bench scripts

}  // namespace remat::cli
