// The planner on the real model: the profiler's table, the estimator against it and against the
// published formula, predictions against measured bytes, and every planner's plan training exactly
// like `none`.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/memory/memory.h"
#include "remat/models/estimator.h"
#include "remat/models/gpt.h"
#include "remat/models/gpt_policies.h"
#include "remat/measure/plan_measurement.h"
#include "remat/planning/planner.h"
#include "remat/chain/policies.h"
#include "remat/planning/profiler.h"
#include "remat/train/trainer.h"
#include "support/compare.h"
#include "support/tiny_gpt.h"

using remat::CostTable;
using remat::Plan;
using remat::models::Gpt;
using remat::models::GptChain;
using remat::models::GptConfig;
using remat::models::GptGranularity;

namespace {

GptConfig small() { return remat::testing::tiny_gpt(4, 32); }

struct Profiled {
  Gpt model{nullptr};
  at::Tensor tokens, targets;
  CostTable costs;
};

Profiled profile_small(GptGranularity granularity = GptGranularity::half) {
  Profiled p;
  torch::manual_seed(0);
  p.model = Gpt(small());
  std::tie(p.tokens, p.targets) = remat::testing::random_batch(4, 32);
  GptChain chain(p.model, granularity);
  chain.set_targets(p.targets);
  p.costs = remat::profile_chain(chain, p.tokens, remat::ProfileOptions().repeats(1));
  return p;
}

}  // namespace

TEST(Profiler, MeasuresSizesThatMatchTheModel) {
  const Profiled p = profile_small();
  ASSERT_EQ(p.costs.stages.size(), 10u);  // embed, 4 × (attn, mlp), head
  const int64_t boundary = 4 * 32 * 32 * 4;
  for (size_t i = 0; i + 1 < p.costs.stages.size(); ++i) EXPECT_EQ(p.costs.stages[i].output_bytes, boundary) << i;
  EXPECT_EQ(p.costs.stages.back().output_bytes, 4);  // the scalar loss
  EXPECT_EQ(p.costs.stages[0].input_grad_bytes, 0);  // tokens need no gradient
  const auto& attn = p.costs.stages[1];
  EXPECT_LT(attn.option("selective").kept_bytes, attn.option("full").kept_bytes);
  EXPECT_EQ(attn.option("full").kept_bytes - attn.option("matmul-inputs").kept_bytes, boundary)
      << "matmul-inputs drops LayerNorm 1's output";
  const auto& mlp = p.costs.stages[2];
  EXPECT_EQ(mlp.option("full").kept_bytes - mlp.option("matmul-inputs").kept_bytes, 5 * boundary)
      << "matmul-inputs drops LayerNorm 2's and GELU's outputs";
  for (const auto& s : p.costs.stages) EXPECT_GE(s.options.front().kept_bytes, s.output_bytes) << s.name;
  // Graph-only, as a segment's last stage: the output is a broadcast 4-byte zero, not B·T·C floats.
  for (const auto* stage : {&attn, &mlp}) {
    for (const auto& o : stage->options) {
      SCOPED_TRACE(stage->name + ":" + o.option);
      ASSERT_TRUE(o.graph_only.has_value());
      const bool skips = !(stage == &mlp && o.option.find("matmul-inputs") != std::string::npos);
      EXPECT_EQ(o.kept_bytes - o.graph_only->kept_bytes, skips ? boundary - 4 : 0);
    }
  }
  EXPECT_EQ(p.costs.stages[0].options[0].graph_only->kept_bytes, p.costs.stages[0].options[0].kept_bytes);
  const CostTable again = CostTable::from_json(p.costs.to_json());
  EXPECT_EQ(again.to_json(), p.costs.to_json());
  EXPECT_NE(p.costs.to_table().find("attn0"), std::string::npos);
}

TEST(Profiler, PredictionsMatchMeasuredBytesAndPlansFitTheirBudget) {
  Profiled p = profile_small();
  GptChain chain(p.model, GptGranularity::half);
  chain.set_targets(p.targets);
  auto measure = [&](const Plan& plan) {
    return remat::measure_step([&] { return remat::run_plan(chain, plan, p.tokens); }).activation_peak_bytes();
  };
  const Plan none = Plan::plain(chain);
  const int64_t predicted_none = remat::simulate(none, p.costs).peak_bytes;
  measure(none);  // gradients allocated, as during profiling
  const int64_t measured_none = measure(none);
  EXPECT_NEAR(static_cast<double>(predicted_none), static_cast<double>(measured_none), 0.10 * measured_none);
  const remat::OptimalPlanner planner(p.costs);
  for (double fraction : {0.3, 0.5, 0.7}) {
    const auto budget = static_cast<int64_t>(fraction * static_cast<double>(predicted_none));
    const auto result = planner.plan(budget);
    ASSERT_TRUE(result.feasible) << fraction;
    const int64_t measured = measure(result.plan);
    SCOPED_TRACE(result.plan.to_string());
    EXPECT_LE(measured, budget) << "budget " << fraction;
    EXPECT_NEAR(static_cast<double>(result.prediction.peak_bytes), static_cast<double>(measured), 0.10 * measured);
  }
}

// Identical layers get one profiled time (the median of theirs): a burst of load on two shared
// cores during one layer's runs no longer makes it look cheaper or dearer than its twins.
TEST(Profiler, TwinGptLayersShareOneTime) {
  Profiled p = profile_small();
  GptChain chain(p.model, GptGranularity::half);
  EXPECT_EQ(chain.stage_signature(1), chain.stage_signature(7)) << "attn0 and attn3";
  EXPECT_NE(chain.stage_signature(1), chain.stage_signature(2)) << "attention and MLP halves";
  EXPECT_TRUE(chain.stage_signature(0).empty());
  for (size_t i = 3; i + 1 < p.costs.stages.size(); ++i) {
    for (size_t o = 0; o < p.costs.stages[i].options.size(); ++o) {
      const auto &stage = p.costs.stages[i].options[o], &twin = p.costs.stages[i - 2].options[o];
      SCOPED_TRACE(p.costs.stages[i].name + " " + stage.option);
      EXPECT_EQ(stage.forward_seconds, twin.forward_seconds);
      EXPECT_EQ(stage.backward_seconds, twin.backward_seconds);
    }
  }
}

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

TEST(Planners, EveryPlannersPlanTrainsLikeNone) {
  remat::train::TrainOptions base;
  base.model = small();
  base.batch = 4;
  base.seed = 3;
  const std::string plan_file =
      (std::filesystem::temp_directory_path() / ("remat-planning-test-" + std::to_string(::getpid()) + ".json"))
          .string();
  auto run = [&](std::optional<Plan> plan) {
    remat::train::TrainOptions o = base;
    if (plan) {
      std::ofstream(plan_file) << plan->to_json();
      o.plan = remat::PlanRequest::of_plan_file(plan_file);
    }
    remat::train::Trainer trainer(o);
    std::vector<double> losses;
    for (int i = 0; i < 3; ++i) losses.push_back(trainer.step().loss);
    std::vector<at::Tensor> parameters;
    for (const auto& t : trainer.model()->parameters()) parameters.push_back(t.detach().clone());
    return std::make_pair(losses, parameters);
  };
  const auto none = run(std::nullopt);
  remat::models::EstimateOptions eo;
  eo.batch = 4;
  eo.granularity = GptGranularity::half;
  const CostTable costs = remat::models::estimate_gpt(small(), eo).costs;
  const Plan plain = Plan::plain(remat::models::GptChainShape(4, GptGranularity::half));
  const remat::OptimalPlanner optimal(costs, remat::PlannerOptions().memory_slots(500));
  const int64_t unchecked = remat::simulate(plain, costs).peak_bytes;
  std::vector<std::pair<std::string, Plan>> plans;
  for (double f : {0.25, 0.5, 0.8}) {
    const auto r = optimal.plan(static_cast<int64_t>(f * unchecked));
    if (r.feasible) plans.emplace_back("optimal " + std::to_string(f), r.plan);
  }
  const auto revolve = remat::revolve_plan(costs, "50%");
  if (revolve.feasible) plans.emplace_back("revolve", revolve.plan);
  const auto chen = remat::chen_greedy_plan(costs, "50%");
  if (chen.feasible) plans.emplace_back("chen", chen.plan);
  ASSERT_GE(plans.size(), 4u);
  for (const auto& [name, plan] : plans) {
    SCOPED_TRACE(name + ": " + plan.to_string());
    const auto outcome = run(plan);
    // Against the same stage options unchecked: checkpointing changes nothing, to the bit. (Options
    // such as fused compute differently by design; their own tests compare them with full.)
    Plan same_options = plain;
    same_options.options = plan.options;
    const auto reference = plan.options == plain.options ? none : run(same_options);
    EXPECT_EQ(outcome.first, reference.first);
    for (size_t i = 0; i < reference.second.size(); ++i) {
      EXPECT_TRUE(remat::testing::bitwise_equal(reference.second[i], outcome.second[i])) << i;
    }
  }
}
