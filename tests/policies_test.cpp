// remat/chain/policies.h: what each policy builds (the generic ones and the GPT's, models/gpt_policies.h), the
// descriptions, and the names refused.
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/chain/plan.h"
#include "remat/chain/policies.h"
#include "remat/models/gpt.h"
#include "remat/models/gpt_policies.h"
#include "support/compare.h"

using remat::Plan;
using remat::models::Gpt;
using remat::models::GptChain;
using remat::models::GptConfig;

namespace {

GptConfig tiny(int64_t layers) {
  GptConfig c;
  c.layers(layers).hidden(16).heads(2).sequence(8);
  return c;
}

std::string compact(const std::string& policy, int64_t layers = 4) {
  GptChain chain(Gpt(tiny(layers)), remat::models::gpt_policy_granularity(policy));
  Plan plan = remat::models::gpt_policy_plan(policy, chain);
  plan.validate_against(chain);
  return plan.to_string();
}

}  // namespace

TEST(Policies, BuildTheDocumentedPlans) {
  EXPECT_EQ(compact("none"), "embed block0 block1 block2 block3 head");
  EXPECT_EQ(compact("block"), "embed [block0] [block1] [block2] [block3] head");
  EXPECT_EQ(compact("every:3"), "embed [block0 block1 block2] [block3] head");
  EXPECT_EQ(compact("segments:2"), "embed [block0 block1] block2 block3 head");
  EXPECT_EQ(compact("segments:3", 7), "embed [block0 block1] [block2 block3] block4 block5 block6 head");
  EXPECT_EQ(compact("sqrt"), "embed [block0 block1] [block2 block3] head");
  EXPECT_EQ(compact("sqrt", 8), "embed [block0 block1 block2] [block3 block4 block5] [block6 block7] head");
  EXPECT_EQ(compact("ffn", 2), "embed attn0 [mlp0] attn1 [mlp1] head");
  EXPECT_EQ(compact("attn", 2), "embed [attn0] mlp0 [attn1] mlp1 head");
  EXPECT_EQ(compact("ffn+attn", 2), "embed [attn0] [mlp0] [attn1] [mlp1] head");
  EXPECT_EQ(compact("core-attn", 2), "embed block0:core-attn block1:core-attn head");
  EXPECT_EQ(compact("matmul-inputs", 2), "embed block0:matmul-inputs block1:matmul-inputs head");
  EXPECT_EQ(compact("block,skip-ends"), "embed block0 [block1] [block2] block3 head");
  EXPECT_EQ(compact("every:2,skip-ends", 6), "embed block0 [block1 block2] [block3 block4] block5 head");
  EXPECT_EQ(compact("ffn,skip-ends", 3), "embed attn0 mlp0 attn1 [mlp1] attn2 mlp2 head");
  EXPECT_EQ(compact("block,skip-ends", 2), "embed block0 block1 head");
}

TEST(Policies, EveryPolicyIsDescribed) {
  const auto list = remat::models::gpt_policy_descriptions();
  EXPECT_GE(list.size(), 10u);
  for (const auto& p : list) EXPECT_FALSE(p.tradeoff.empty()) << p.name;
  EXPECT_EQ(list.back().name, "<policy>,skip-ends");
  EXPECT_EQ(remat::policy_descriptions().size(), 7u) << "the core's policies are the generic ones";
}

TEST(Policies, RejectUnknownNamesAndBadNumbers) {
  using remat::models::gpt_policy_granularity;
  REMAT_EXPECT_ERROR(gpt_policy_granularity("blocks"), "unknown policy 'blocks'. Known policies: none, block");
  REMAT_EXPECT_ERROR(gpt_policy_granularity("every"), "needs a number: every:K");
  REMAT_EXPECT_ERROR(gpt_policy_granularity("every:0"), "K must be a whole number >= 1");
  REMAT_EXPECT_ERROR(gpt_policy_granularity("every:2x"), "K must be a whole number >= 1");
  REMAT_EXPECT_ERROR(gpt_policy_granularity("block:2"), "only every:K and segments:K take a number");
  REMAT_EXPECT_ERROR(remat::check_policy("ffn"), "unknown policy 'ffn'. Known policies: none, block");
  REMAT_EXPECT_ERROR(compact("segments:5"), "K must be at most the number of blocks");
  // The unchecked plan has one name: the others are refused, naming it.
  for (const char* other : {"plain", "unchecked", "no-checkpoint"}) {
    REMAT_EXPECT_ERROR(remat::check_policy(other), "the plan that checkpoints nothing is the policy 'none'");
    REMAT_EXPECT_ERROR(gpt_policy_granularity(std::string(other) + ",skip-ends"), "is the policy 'none'");
  }
}
