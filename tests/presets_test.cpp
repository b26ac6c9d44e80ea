// remat/train/presets.h: the presets, data embedded at configure time, and the side-by-side policies.
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/models/gpt_policies.h"
#include "remat/train/presets.h"
#include "support/compare.h"

// The presets are data (train/presets.json, embedded at configure time and read by
// bench/pytorch_side_by_side.py too): the values tools rely on, and the side-by-side policies.

TEST(Presets, TheEmbeddedFileHoldsTheFourPresetsInOrder) {
  EXPECT_EQ(remat::train::preset_names(), "demo, reference, 7b, 13b");
  const remat::train::Preset& demo = remat::train::preset("demo");
  EXPECT_TRUE(demo.runnable);
  EXPECT_EQ(demo.steps, std::optional<int64_t>(300));
  EXPECT_EQ(demo.lr, std::optional<double>(2e-3));
  EXPECT_EQ(demo.warmup_steps, std::optional<int64_t>(30));
  const remat::train::Preset& big = remat::train::preset("13b");
  EXPECT_FALSE(big.runnable);
  EXPECT_EQ(big.model.layers(), 40);
  EXPECT_EQ(big.model.vocabulary(), 32000);
  EXPECT_EQ(big.dtype, "bf16");
  REMAT_EXPECT_ERROR(remat::train::preset("nope"), "unknown preset 'nope'; the presets are demo, reference, 7b, 13b.");
}

TEST(Presets, TheReferencePresetIsTheReferenceWorkload) {
  const remat::train::Preset& p = remat::train::preset("reference");
  EXPECT_TRUE(p.runnable);
  EXPECT_EQ(p.model.layers(), 8);
  EXPECT_EQ(p.model.hidden(), 256);
  EXPECT_EQ(p.model.heads(), 8);
  EXPECT_EQ(p.model.sequence(), 256);
  EXPECT_EQ(p.model.vocabulary(), 256);
  EXPECT_DOUBLE_EQ(p.model.dropout(), 0.1);
  EXPECT_EQ(p.batch, 8);
  EXPECT_FALSE(p.steps.has_value());
  EXPECT_FALSE(p.lr.has_value());
  EXPECT_FALSE(p.warmup_steps.has_value());
  EXPECT_EQ(p.dtype, "fp32");
}

TEST(Presets, EverySideBySidePolicyIsOneTheGptAccepts) {
  const std::vector<std::string>& policies = remat::train::side_by_side_policies();
  ASSERT_FALSE(policies.empty());
  EXPECT_EQ(policies.front(), "none");  // the baseline of the comparison's time ratios and losses
  for (const std::string& policy : policies) {
    EXPECT_NO_THROW(remat::models::gpt_policy_granularity(policy)) << policy;
  }
}
