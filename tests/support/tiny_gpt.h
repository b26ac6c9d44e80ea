// Small GPT configurations and random batches for tests: hidden 32, 4 heads, dropout 0.1.
#pragma once

#include <utility>

#include <torch/torch.h>

#include "remat/models/gpt.h"

namespace remat::testing {

inline models::GptConfig tiny_gpt(int64_t layers, int64_t sequence) {
  models::GptConfig c;
  c.layers(layers).hidden(32).heads(4).sequence(sequence).dropout(0.1);
  return c;
}

/// Random tokens and targets, (batch, tokens) each.
inline std::pair<at::Tensor, at::Tensor> random_batch(int64_t batch, int64_t tokens) {
  at::Tensor inputs = torch::randint(0, 256, {batch, tokens}, torch::kLong);
  return {inputs, torch::randint(0, 256, {batch, tokens}, torch::kLong)};
}

}  // namespace remat::testing
