// Named GPT configurations, as data: the one place that says what "demo", "reference", "7b" and
// "13b" mean, for every tool that takes a preset. The data is train/presets.json, embedded at
// configure time and parsed once, on the first call here; bench/pytorch_side_by_side.py reads the
// same file (the runnable presets, and side_by_side_policies()).
//
//   const remat::train::Preset& p = remat::train::preset("reference");   // throws, naming the known ones
//   remat::models::Gpt model(p.model);                                   // p.batch, p.steps, ... likewise
//
// A preset sets the model and the batch, and may set training settings (steps, learning rate,
// warm-up) and the activation dtype of an estimate. The `remat` tools apply one to the settings
// their flags left unset (tools/remat/model_flags.cpp, ModelFlags::apply_preset). 7B/13B-class
// presets are for the analytic estimator only: `runnable` is false, and every subcommand but
// `remat estimate` refuses them there, before allocating anything.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "remat/models/gpt.h"

namespace remat::train {

struct Preset {
  std::string name;
  std::string description;
  bool runnable = true;  ///< false: too big to run on one machine; for estimates
  models::GptConfig model;
  int64_t batch = 8;
  std::optional<int64_t> steps;
  std::optional<double> lr;
  std::optional<int64_t> warmup_steps;
  std::string dtype = "fp32";  ///< activation dtype of estimates: fp32, bf16 or fp16
};

/// Every preset, in the order tools list them.
const std::vector<Preset>& presets();

/// The preset called `name`; an error naming the known presets otherwise.
const Preset& preset(const std::string& name);

/// The names of presets, comma-separated, for help texts and errors.
std::string preset_names();

/// The remat policies bench/pytorch_side_by_side.py compares by default (PyTorch 2.x adds more), in
/// its order; every one a policy the GPT accepts (models::gpt_policy_granularity).
const std::vector<std::string>& side_by_side_policies();

}  // namespace remat::train
