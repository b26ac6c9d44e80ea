// Command-line flags that describe the GPT and its training, shared by `train` and `plan`, with
// presets whose values apply to every flag the user did not give.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "remat/train/trainer.h"

namespace remat::cli {

struct ModelFlags {
  train::TrainOptions options;
  std::string preset;
  CLI::App* app = nullptr;

  /// Registers --layers --hidden --heads --seq --batch --dropout --threads --seed --preset.
  void add_to(CLI::App& command);
  /// Applies the preset to the flags not given explicitly; throws for an unknown preset.
  void apply_preset();
};

}  // namespace remat::cli
