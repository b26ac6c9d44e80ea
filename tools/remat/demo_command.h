#pragma once

#include <cstdint>

#include <CLI/CLI.hpp>

namespace remat::cli {

struct DemoOptions {
  int64_t layers = 8;
  int64_t channels = 256;
  int64_t batch = 8;
  int64_t tokens = 256;
  double dropout = 0.1;
  int64_t steps = 3;
  int threads = 2;
  uint64_t seed = 0;
};

/// Registers `remat demo` on the app.
void add_demo_command(CLI::App& app);

}  // namespace remat::cli
