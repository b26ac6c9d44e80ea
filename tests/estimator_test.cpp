// remat/models/estimator.h: the estimate of a GPT's activations, against the published formula and the profiler.
#include <cstdint>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/models/estimator.h"
#include "remat/models/gpt.h"
#include "support/profiled_gpt.h"

using remat::models::GptConfig;
using remat::models::GptGranularity;
using remat::testing::profile_small;
using remat::testing::Profiled;
using remat::testing::small;

TEST(Estimator, AgreesWithThePublishedFigureOnA13BConfig) {
  GptConfig c;
  c.layers(40).hidden(5120).heads(40).sequence(2048).vocabulary(32000);
  remat::models::EstimateOptions o;
  o.dtype = "bf16";
  const auto est = remat::models::estimate_gpt(c, o);
  EXPECT_EQ(est.published_block_bytes, int64_t{2048} * 5120 * 34 + int64_t{5} * 40 * 2048 * 2048);
  // The only difference: LayerNorm's fp32 mean and rstd, 16 bytes per token per layer.
  EXPECT_EQ(est.block_bytes - est.published_block_bytes, 16 * 2048);
}

TEST(Estimator, AgreesWithTheProfilerOnASmallModel) {
  // LibTorch 1.13's CPU dropout keeps its noise in fp32 (mask bytes = element bytes).
  const Profiled p = profile_small(GptGranularity::block);
  remat::models::EstimateOptions o;
  o.batch = 4;
  o.dropout_mask_bytes = 0;
  const auto est = remat::models::estimate_gpt(small(), o);
  for (size_t i = 1; i + 1 < p.costs.stages.size(); ++i) {
    const double measured = static_cast<double>(p.costs.stages[i].options.front().kept_bytes);
    const double estimated = static_cast<double>(est.costs.stages[i].options.front().kept_bytes);
    EXPECT_NEAR(estimated, measured, 0.05 * measured) << p.costs.stages[i].name;
  }
}
