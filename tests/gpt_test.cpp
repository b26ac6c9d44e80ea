// remat/models/gpt.h: the GPT and its chain: the chain computes the model's loss, its configuration errors name
// their fields, and stage options keep what they claim and compute what the plain ones do.
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/base/error.h"
#include "remat/chain/plan.h"
#include "remat/measure/plan_measurement.h"
#include "remat/memory/memory.h"
#include "remat/models/gpt.h"
#include "remat/models/gpt_policies.h"
#include "support/compare.h"
#include "support/tiny_gpt.h"

using remat::models::Gpt;
using remat::models::GptChain;
using remat::models::GptConfig;
using remat::models::GptGranularity;

namespace {

GptConfig config() { return remat::testing::tiny_gpt(3, 16); }

std::pair<at::Tensor, at::Tensor> batch(int64_t b, int64_t t) { return remat::testing::random_batch(b, t); }

// config() without dropout, as a block chain with its targets set, on a (2, 16) batch.
struct NoDropoutBlockChain {
  static GptConfig no_dropout() {
    GptConfig c = config();
    c.dropout(0.0);
    return c;
  }
  GptConfig c = no_dropout();
  Gpt model{c};
  GptChain chain{model, GptGranularity::block};
  at::Tensor tokens, targets;
  NoDropoutBlockChain() {
    std::tie(tokens, targets) = batch(2, 16);
    chain.set_targets(targets);
  }
};

}  // namespace

TEST(Gpt, ChainUnderThePlainPlanComputesTheModelsLoss) {
  torch::manual_seed(0);
  Gpt model(config());
  auto [tokens, targets] = batch(2, 16);
  torch::manual_seed(1);
  const at::Tensor direct = model->forward(tokens, targets);
  for (const GptGranularity granularity : {GptGranularity::block, GptGranularity::half}) {
    GptChain chain(model, granularity);
    chain.set_targets(targets);
    torch::manual_seed(1);
    EXPECT_TRUE(remat::testing::bitwise_equal(direct, remat::run_plan(chain, remat::Plan::unchecked(chain), tokens)))
        << to_string(granularity);
  }
}

TEST(Gpt, GranularityIsReadFromPlansWithOneClearError) {
  using remat::models::gpt_granularity_of;
  Gpt model(config());
  remat::models::GptChains chains(model);
  for (const GptGranularity granularity : {GptGranularity::block, GptGranularity::half}) {
    const remat::Plan plan = remat::Plan::unchecked(GptChain(model, granularity));
    EXPECT_EQ(plan.granularity, to_string(granularity));
    EXPECT_EQ(gpt_granularity_of(plan), granularity);
    EXPECT_EQ(&chains.of(plan), granularity == GptGranularity::half ? &chains.half : &chains.block);
  }
  remat::Plan other = remat::Plan::unchecked(chains.block);
  other.granularity = "modules";
  REMAT_EXPECT_ERROR(gpt_granularity_of(other), "granularity 'modules' is not one a GPT chain offers: 'block'");
  REMAT_EXPECT_ERROR(chains.of(other), "'half' (attention and MLP halves)");
  other.granularity = std::string(100, 'x');
  REMAT_EXPECT_ERROR(remat::models::parse_gpt_granularity(other.granularity, "big.json"),
                     "big.json: granularity '" + std::string(37, 'x') + "...' is not one");
}

// One name per stage option: the Megatron-style one is core-attn; its old name, which also named
// per-operator checkpointing, is refused as an option and as a policy, naming the new one.
TEST(Gpt, StageOptionsHaveOneNameAndTheOldOneIsRefused) {
  using remat::models::Keep;
  EXPECT_EQ(remat::models::parse_keep("core-attn"), Keep::core_attn);
  EXPECT_STREQ(remat::models::to_string(Keep::core_attn), "core-attn");
  for (const auto& option : remat::models::keep_options()) {
    EXPECT_EQ(remat::models::parse_keep(option.name), option.keep) << option.name;
  }
  REMAT_EXPECT_ERROR(remat::models::parse_keep("selective"), "the stage option 'selective' is now called 'core-attn'");
  REMAT_EXPECT_ERROR(remat::models::gpt_policy_granularity("selective"), "is now 'core-attn'");
  REMAT_EXPECT_ERROR(remat::models::gpt_policy_plan("selective,skip-ends", 4), "is now 'core-attn'");
  EXPECT_EQ(remat::models::gpt_policy_plan("core-attn", 2).to_string(), "embed block0:core-attn block1:core-attn head");
}

TEST(Gpt, ConfigErrorsAreClear) {
  GptConfig c = config();
  c.heads(5);
  try {
    Gpt model(c);
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("GptConfig::heads (5) must divide GptConfig::hidden (32)"),
              std::string::npos);
  }
}

// The fields an error names are data: a program that took them from flags names the flags, with no
// rewriting of the text (its wording can change freely).
TEST(Gpt, ConfigErrorsNameTheirFieldsStructurally) {
  GptConfig c = config();
  c.heads(5);
  try {
    c.validate();
    FAIL();
  } catch (const remat::FieldError& e) {
    EXPECT_EQ(e.fields(), (std::vector<std::string>{"GptConfig::heads", "GptConfig::hidden"}));
    const std::string renamed = e.message_naming([](const std::string& f) { return "<" + f.substr(11) + ">"; });
    EXPECT_NE(renamed.find("remat: <heads> (5) must divide <hidden> (32)"), std::string::npos) << renamed;
    EXPECT_EQ(std::string(e.what_without_backtrace()).find('\x1f'), std::string::npos) << "markers never show";
  }
  // Messages that name no field stay plain c10::Errors.
  try {
    REMAT_CHECK(false, "no field here");
  } catch (const remat::FieldError&) {
    ADD_FAILURE() << "a message without fields is no FieldError";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("remat: no field here"), std::string::npos);
  }
}

TEST(Gpt, MatmulInputsOptionDropsTheLayerNormAndGeluOutputsExactly) {
  remat::install_cpu_memory_tracker();
  torch::manual_seed(0);
  NoDropoutBlockChain gpt;
  const GptConfig& c = gpt.c;
  Gpt& model = gpt.model;
  GptChain& chain = gpt.chain;
  const at::Tensor& tokens = gpt.tokens;
  auto held_after_forward = [&](const std::string& policy) {
    const remat::Plan plan = remat::models::gpt_policy_plan(policy, chain);
    model->zero_grad();
    return remat::measure_step([&] { return remat::run_plan(chain, plan, tokens); })
        .activation_bytes_at_end_of_forward();
  };
  held_after_forward("none");  // allocate the gradients once, before measuring
  const int64_t full = held_after_forward("none");
  const int64_t matmul_inputs = held_after_forward("matmul-inputs");
  const int64_t btc_bytes = 2 * 16 * c.hidden() * 4;
  // Per block: LN1 and LN2 outputs (B·T·C each) and the GELU output (B·T·4C).
  EXPECT_EQ(full - matmul_inputs, c.layers() * 6 * btc_bytes);
}

TEST(Gpt, GraphOnlyStagesGiveTheSameGradientsWithoutComputingTheirOutput) {
  // forward_stage_graph_only skips the final projection's matmul (and the dropout product and
  // residual sum after it): same gradients to the bit, as the dropout mask is drawn by the same
  // generator calls, and an output that holds no data.
  torch::manual_seed(0);
  Gpt model(config());
  model->train();
  for (const GptGranularity granularity : {GptGranularity::block, GptGranularity::half}) {
    GptChain chain(model, granularity);
    for (int64_t index = 1; index + 1 < chain.size(); ++index) {
      for (const std::string& option : chain.stages()[index].options) {
        SCOPED_TRACE(chain.stages()[index].name + ":" + option);
        const at::Tensor input = torch::randn({2, 16, config().hidden()});
        const at::Tensor grad = torch::randn({2, 16, config().hidden()});
        auto run = [&](bool graph_only) {
          model->zero_grad(/*set_to_none=*/true);
          const at::Tensor x = input.clone().requires_grad_(true);
          torch::manual_seed(7);
          at::Tensor y =
              graph_only ? chain.forward_stage_graph_only(index, x, option) : chain.forward_stage(index, x, option);
          const int64_t output_bytes = static_cast<int64_t>(y.storage().nbytes());
          y.backward(grad);
          auto grads = remat::testing::parameter_grads(*model);
          grads.emplace_back("input", x.grad().clone());
          return std::make_pair(grads, output_bytes);
        };
        const auto [plain, plain_bytes] = run(false);
        const auto [graph_only, graph_only_bytes] = run(true);
        ASSERT_EQ(plain.size(), graph_only.size());
        for (size_t i = 0; i < plain.size(); ++i) {
          EXPECT_TRUE(remat::testing::bitwise_equal(plain[i].second, graph_only[i].second)) << plain[i].first;
        }
        EXPECT_EQ(plain_bytes, 2 * 16 * config().hidden() * 4);
        const bool skips = !(remat::models::recomputes_matmul_inputs(remat::models::parse_keep(option)) &&
                             remat::models::gpt_stage_kind(index, chain.size(), chain.gpt_granularity()) !=
                                 remat::models::GptStage::attention);
        EXPECT_EQ(graph_only_bytes, skips ? 4 : plain_bytes) << "the output's storage";
      }
    }
  }
}

TEST(Gpt, FusedAttentionHalfKeepsNoTermQuadraticInTheSequence) {
  // What the attention half keeps under fused, exactly: LayerNorm 1's mean, rstd and output, the QKV
  // output (q, k, v are views of it), the attention output (also the projection's input), one
  // log-sum-exp per query row and head, the half's output. No dropout mask, no (B,NH,T,T) map.
  remat::install_cpu_memory_tracker();
  torch::manual_seed(0);
  const GptConfig c = remat::testing::tiny_gpt(1, 64);
  Gpt model(c);
  model->train();
  GptChain chain(model, GptGranularity::half);
  auto kept = [&](int64_t T, const std::string& option) {
    const at::Tensor x = torch::randn({2, T, c.hidden()}).requires_grad_();
    const int64_t before = remat::memory_stats().current_bytes;
    const at::Tensor y = chain.forward_stage(1, x, option);
    return remat::memory_stats().current_bytes - before;
  };
  for (const int64_t T : {16, 32}) {
    EXPECT_EQ(kept(T, "fused"), 2 * T * (2 * 4 + 6 * c.hidden() * 4 + c.heads() * 4)) << "T " << T;
  }
  EXPECT_EQ(kept(32, "fused"), 2 * kept(16, "fused")) << "doubling T doubles what fused keeps";
  EXPECT_GT(kept(32, "full"), 2 * kept(16, "full")) << "plain attention keeps (B,NH,T,T) maps";
  EXPECT_EQ(kept(32, "fused") - kept(32, "fused+matmul-inputs"), 2 * 32 * c.hidden() * 4) << "LayerNorm 1's output";
}

TEST(Gpt, FusedOptionsComputePlainAttentionsGradientsWithoutDropout) {
  torch::manual_seed(0);
  NoDropoutBlockChain gpt;
  Gpt& model = gpt.model;
  GptChain& chain = gpt.chain;
  const at::Tensor& tokens = gpt.tokens;
  auto gradients = [&](const std::string& policy) {
    model->zero_grad(/*set_to_none=*/true);
    remat::run_plan(chain, remat::models::gpt_policy_plan(policy, chain), tokens).backward();
    return remat::testing::parameter_grads(*model);
  };
  const auto none = gradients("none");
  for (const std::string policy : {"fused", "fused+matmul-inputs"}) {
    const auto fused = gradients(policy);
    ASSERT_EQ(none.size(), fused.size());
    for (size_t i = 0; i < none.size(); ++i) {
      EXPECT_TRUE(none[i].second.allclose(fused[i].second, 1e-4, 1e-6)) << policy << ": " << none[i].first;
    }
  }
}

TEST(Gpt, CheckpointingFusedStagesIsExactWithDropout) {
  // Regenerated dropout draws its seed from the generator a recompute restores: checkpointed fused
  // stages (graph-only segment ends included) give the unchecked fused run's gradients, to the bit.
  torch::manual_seed(0);
  Gpt model(config());
  model->train();
  auto [tokens, targets] = batch(2, 16);
  for (const std::string policy : {"block", "every:2", "ffn+attn", "attn"}) {
    for (const std::string option : {"fused", "fused+matmul-inputs"}) {
      SCOPED_TRACE(policy + " with " + option);
      GptChain chain(model, remat::models::gpt_policy_granularity(policy));
      chain.set_targets(targets);
      remat::Plan plan = remat::models::gpt_policy_plan(policy, chain);
      for (int64_t i = 1; i + 1 < chain.size(); ++i) plan.options[i] = option;
      const remat::PlanVerification v = remat::verify_plan(chain, plan, tokens);
      EXPECT_TRUE(v.bitwise_equal()) << v.to_string();
    }
  }
}

TEST(Gpt, FusedOptionsTrainLikePlainOnes) {
  // Another dropout generator and another attention kernel: not the same numbers, the same
  // learning. Mean loss of the last 20 of 60 steps on a fixed batch set, dropout 0.1.
  auto train = [](const std::string& policy) {
    torch::manual_seed(1);
    Gpt model(remat::testing::tiny_gpt(2, 32));
    model->train();
    GptChain chain(model, GptGranularity::block);
    const remat::Plan plan = remat::models::gpt_policy_plan(policy, chain);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3));
    torch::manual_seed(2);
    const at::Tensor data = torch::randint(0, 16, {4, 8, 33}, torch::kLong);  // 4 batches from 16 symbols
    double late = 0;
    for (int step = 0; step < 60; ++step) {
      const at::Tensor b = data[step % 4];
      chain.set_targets(b.narrow(1, 1, 32));
      optimizer.zero_grad();
      at::Tensor loss = remat::run_plan(chain, plan, b.narrow(1, 0, 32).contiguous());
      loss.backward();
      optimizer.step();
      if (step >= 40) late += loss.item<double>() / 20;
    }
    return late;
  };
  const double none = train("none"), fused = train("fused");
  EXPECT_LT(none, 3.2) << "the model learned: from log 256 = 5.5 towards the 16 symbols' log 16 = 2.8";
  EXPECT_NEAR(fused, none, 0.05 * none);
}
