#pragma once

#include <CLI/CLI.hpp>

namespace remat::cli {

/// Registers `remat policies` and `remat plan`.
void add_plan_commands(CLI::App& app);

}  // namespace remat::cli
