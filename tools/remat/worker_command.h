#pragma once

#include <CLI/CLI.hpp>

namespace remat::cli {

/// Registers `remat worker`: measured steps on request, for side-by-side runs driven by another
/// process (bench/pytorch_side_by_side.py).
void add_worker_command(CLI::App& app);

}  // namespace remat::cli
