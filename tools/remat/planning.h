// The CLI's side of planning for the GPT: the model and batch its flags describe, and profiles read
// from or written to files. Planning itself is the library's (models/gpt_planning.h).
#pragma once

#include <string>
#include <vector>

#include "remat/memory/memory.h"
#include "remat/models/gpt.h"
#include "remat/models/gpt_planning.h"
#include "remat/train/trainer.h"

namespace remat::cli {

using ModelCosts = models::GptCosts;

/// The GPT of `options` (seeded, in training mode) and one batch of its corpus.
struct SampleModel {
  models::Gpt model{nullptr};
  at::Tensor tokens, targets;
};
SampleModel make_sample_model(const train::TrainOptions& options);

/// One measured training step of `plan` on the sample's batch: gradients zeroed in place (kept
/// allocated, as between training steps), the CPU generator seeded with `seed` so dropout masks
/// repeat, then forward and backward.
struct SeededStep {
  StepMeasurement measurement;
  double loss = 0;
};
SeededStep seeded_step(SampleModel& sample, Chain& chain, const Plan& plan, uint64_t seed);

/// Profiles the GPT of `options` (half-block chain) on a batch of its corpus.
/// The GPT's half-block profile on the options' sample batch; segment ends costed for `mode`.
ModelCosts profile_model(const train::TrainOptions& options, int repeats, CheckpointMode mode);
void save_profile(const ModelCosts& costs, const std::string& path);
/// A saved profile, checked to describe the GPT and batch of `options`.
ModelCosts load_profile_for(const std::string& path, const train::TrainOptions& options);

/// Budgets as given to --budget (Budget's forms), checked for form and repeats before anything is
/// profiled; empty entries are skipped.
std::vector<std::string> budget_list(const std::vector<std::string>& given);

}  // namespace remat::cli
