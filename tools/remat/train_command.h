#pragma once

#include <CLI/CLI.hpp>

namespace remat::cli {

/// Registers `remat train`.
void add_train_command(CLI::App& app);

}  // namespace remat::cli
