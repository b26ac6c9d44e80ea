// Test helpers: a small GPT (4 layers, hidden 32, 32 tokens, batch 4) and its profile, as the tests of
// the planning on the real model take them.
#pragma once

#include <tuple>

#include <torch/torch.h>

#include "remat/measure/profiler.h"
#include "remat/models/gpt.h"
#include "remat/planning/cost_model.h"
#include "support/tiny_gpt.h"

namespace remat::testing {

inline models::GptConfig small() { return remat::testing::tiny_gpt(4, 32); }

struct Profiled {
  models::Gpt model{nullptr};
  at::Tensor tokens, targets;
  CostTable costs;
};

inline Profiled profile_small(models::GptGranularity granularity = models::GptGranularity::half) {
  Profiled p;
  torch::manual_seed(0);
  p.model = models::Gpt(small());
  std::tie(p.tokens, p.targets) = remat::testing::random_batch(4, 32);
  models::GptChain chain(p.model, granularity);
  chain.set_targets(p.targets);
  p.costs = remat::profile_chain(chain, p.tokens, remat::ProfileOptions().repeats(1));
  return p;
}

}  // namespace remat::testing
