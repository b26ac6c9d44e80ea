#pragma once

#include <CLI/CLI.hpp>

namespace remat::cli {

/// Registers `remat estimate`.
void add_estimate_command(CLI::App& app);

}  // namespace remat::cli
