// remat/measure/profiler.h: profile_chain's table (sizes, noise, twins, what a checkpoint adds) on the GPT and on
// sequential models, and the options it refuses.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/chain/plan.h"
#include "remat/chain/sequential_chain.h"
#include "remat/measure/profiler.h"
#include "remat/memory/memory.h"
#include "remat/models/gpt.h"
#include "remat/planning/cost_model.h"
#include "remat/planning/planner.h"
#include "support/profiled_gpt.h"
#include "support/sequential_models.h"
#include "support/timing.h"

namespace nn = torch::nn;
using remat::CostTable;
using remat::Plan;
using remat::models::GptChain;
using remat::models::GptGranularity;
using remat::testing::CountingChain;
using remat::testing::mlp;
using remat::testing::Noisy;
using remat::testing::profile_small;
using remat::testing::Profiled;
using remat::testing::Quiet;
using remat::testing::sample;
using remat::testing::steady;
using remat::testing::sum_loss;

namespace {

// Uniform in [0, 40) ms, the same sequence on every run: wide enough that a loaded machine's
// oversleeping (a few ms per call) cannot make it look steady.
std::function<double()> scattered() {
  auto state = std::make_shared<uint64_t>(12345);
  return [state] {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return 40.0 * static_cast<double>(*state >> 11) / static_cast<double>(1ULL << 53);
  };
}

}  // namespace

TEST(Profiler, ANoisyStageGetsMoreRunsAndAWiderInterval) {
  torch::manual_seed(0);
  nn::Sequential net(nn::Linear(8, 8), Quiet(steady(20)), Noisy(scattered()));
  remat::SequentialChain chain(net, sum_loss());
  const auto options =
      remat::ProfileOptions().repeats(3).max_repeats(15).tolerance(0.25).stage_seconds(20).in_step_seconds(1);
  const remat::CostTable costs = remat::profile_chain(chain, sample(), options);
  const remat::StageCost& quiet = costs.stages[1];
  const remat::StageCost& noisy = costs.stages[2];
  // A 20 ms sleep is pinned down within 25% by its first runs, even on a loaded machine (a sleep
  std::fprintf(stderr, "quiet %d rounds %.4f spread %.3f; noisy %d rounds %.4f spread %.3f\n", quiet.measured_rounds,
               quiet.options[0].forward_seconds + quiet.options[0].backward_seconds, quiet.relative_spread(),
               noisy.measured_rounds, noisy.options[0].forward_seconds + noisy.options[0].backward_seconds,
               noisy.relative_spread());
  // of 3 ms was not, in CI); sleeps scattered over 0-40 ms are not within 15, the most allowed.
  EXPECT_EQ(noisy.measured_rounds, 15);
  EXPECT_LT(quiet.measured_rounds, noisy.measured_rounds);
  EXPECT_GT(noisy.relative_spread(), 0.25);
  EXPECT_GT(noisy.relative_spread(), 2 * quiet.relative_spread());
  const std::vector<std::string> unstable = costs.unstable_stages(0.25);
  EXPECT_NE(std::find(unstable.begin(), unstable.end(), noisy.name), unstable.end());
  EXPECT_NE(costs.source.find("not within 25%"), std::string::npos) << costs.source;
  // A plan recomputing the noisy stage predicts a wider interval than one recomputing the quiet one.
  const remat::Plan plain = remat::Plan::unchecked(chain);
  remat::Plan recompute_quiet = plain, recompute_noisy = plain;
  recompute_quiet.items = {remat::PlanItem::run(0), remat::PlanItem::checkpointed({remat::PlanItem::run(1)}),
                           remat::PlanItem::run(2), remat::PlanItem::run(3)};
  recompute_noisy.items = {remat::PlanItem::run(0), remat::PlanItem::run(1),
                           remat::PlanItem::checkpointed({remat::PlanItem::run(2)}), remat::PlanItem::run(3)};
  const remat::Prediction unchecked = remat::simulate(plain, costs);
  const double quiet_spread = remat::predicted_overhead_spread(remat::simulate(recompute_quiet, costs), unchecked);
  const double noisy_spread = remat::predicted_overhead_spread(remat::simulate(recompute_noisy, costs), unchecked);
  EXPECT_GT(noisy_spread, 2 * quiet_spread);
  EXPECT_GT(remat::simulate(recompute_noisy, costs).step_seconds_spread, unchecked.step_seconds_spread * 0.5);
  // The spread survives a round trip through the table's file format.
  const remat::CostTable read = remat::CostTable::from_json(costs.to_json());
  EXPECT_DOUBLE_EQ(read.stages[2].spread_seconds, noisy.spread_seconds);
  EXPECT_EQ(read.threads, costs.threads);
}

TEST(Profiler, RefusesToleranceAndTimeLimitsThatCannotWork) {
  nn::Sequential net(nn::Linear(8, 8));
  remat::SequentialChain chain(net, sum_loss());
  // More repeats than max_repeats: the repeats are the fewest runs, so all of them are made.
  const remat::CostTable many = remat::profile_chain(
      chain, sample(), remat::ProfileOptions().repeats(17).max_repeats(3).stage_seconds(0).in_step_seconds(0));
  EXPECT_EQ(many.stages[0].measured_rounds, 17);
  EXPECT_THROW(remat::profile_chain(chain, sample(), remat::ProfileOptions().in_step_seconds(-1)), c10::Error);
  EXPECT_THROW(remat::profile_chain(chain, sample(), remat::ProfileOptions().tolerance(std::nan(""))), c10::Error);
  EXPECT_THROW(remat::profile_chain(chain, sample(), remat::ProfileOptions().tolerance(0)), c10::Error);
  EXPECT_THROW(remat::profile_chain(chain, sample(), remat::ProfileOptions().stage_seconds(-1)), c10::Error);
}

TEST(Profiler, MeasuresSizesThatMatchTheModel) {
  const Profiled p = profile_small();
  ASSERT_EQ(p.costs.stages.size(), 10u);  // embed, 4 × (attn, mlp), head
  const int64_t boundary = 4 * 32 * 32 * 4;
  for (size_t i = 0; i + 1 < p.costs.stages.size(); ++i) EXPECT_EQ(p.costs.stages[i].output_bytes, boundary) << i;
  EXPECT_EQ(p.costs.stages.back().output_bytes, 4);  // the scalar loss
  EXPECT_EQ(p.costs.stages[0].input_grad_bytes, 0);  // tokens need no gradient
  const auto& attn = p.costs.stages[1];
  EXPECT_LT(attn.option("core-attn").kept_bytes, attn.option("full").kept_bytes);
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
  const Plan none = Plan::unchecked(chain);
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

TEST(SequentialChain, TwinStagesShareOneProfiledTime) {
  const at::Tensor x = torch::randn({16, 32});
  nn::Sequential net = mlp(3);  // Linear(32,128) GELU Dropout Linear(128,32), three times, then Linear(32,10)
  remat::SequentialChain chain(net, [](const at::Tensor& out) { return out.pow(2).mean(); });
  EXPECT_EQ(chain.stage_signature(0), chain.stage_signature(4));
  EXPECT_NE(chain.stage_signature(0), chain.stage_signature(3)) << "Linear(32,128) is not Linear(128,32)";
  const remat::CostTable costs = remat::profile_chain(chain, x, remat::ProfileOptions().repeats(1));
  // Stages 4 and 8 are twins (stage 0 has the same modules but its input needs no gradient, so its
  // backward is another computation and keeps its own time: not asserted, two times may tie).
  for (const int64_t first : {1, 2, 3, 4}) {
    const auto& a = costs.stages[first];
    const auto& b = costs.stages[first + 4];
    EXPECT_EQ(a.options[0].forward_seconds, b.options[0].forward_seconds) << a.name;
    EXPECT_EQ(a.options[0].backward_seconds, b.options[0].backward_seconds) << a.name;
    EXPECT_EQ(a.nograd_seconds, b.nograd_seconds) << a.name;
  }
}

TEST(SequentialChain, TwinsBeyondTheFirstFourAreNotTimedAgain) {
  const at::Tensor x = torch::randn({16, 32});
  nn::Sequential net = mlp(7);  // Linear(32,128) at stages 0, 4, ..., 24: stage 0 apart (its input needs no grad)
  CountingChain chain(net, [](const at::Tensor& out) { return out.pow(2).mean(); });
  const remat::CostTable costs = remat::profile_chain(chain, x, remat::ProfileOptions().repeats(2));
  // Every stage runs in the pass that makes each stage's input and in the whole-step rounds that
  // time stages within a step: per round, a plain step, then the stage checkpointed alone and in a
  // pair (a forward and a recompute each), and where steps are short an untimed step before each
  // timed one. Short steps get more rounds than the repeats: at least the warm-up and the repeats.
  const int whole_step_runs = chain.runs[20];
  EXPECT_EQ((whole_step_runs - 1) % 5, 0) << whole_step_runs;
  EXPECT_GE((whole_step_runs - 1) / 5, 1 + 2) << whole_step_runs;
  EXPECT_GT(chain.runs[16], whole_step_runs) << "the fourth twin is timed";
  EXPECT_EQ(chain.runs[24], whole_step_runs) << "the fifth twin and later are not timed on their own";
  EXPECT_GT(chain.runs[0], whole_step_runs) << "stage 0 is no twin of theirs";
  const auto& timed = costs.stages[4];
  const auto& copied = costs.stages[24];
  EXPECT_EQ(copied.name, chain.stages()[24].name);
  EXPECT_EQ(copied.output_bytes, timed.output_bytes);
  EXPECT_EQ(copied.options[0].kept_bytes, timed.options[0].kept_bytes);
  EXPECT_EQ(copied.options[0].forward_seconds, timed.options[0].forward_seconds);
  EXPECT_EQ(copied.options[0].backward_seconds, timed.options[0].backward_seconds);
}

TEST(SequentialChain, NonReentrantProfilesCostTheGenericEarlyStopAtSegmentEnds) {
  // Stage a saves tanh's output, then computes two more tensors nothing saves: a non-reentrant
  // recompute ending there stops after tanh and keeps only its output, not the stage's output.
  torch::manual_seed(0);
  nn::Linear a(16, 16), b(16, 16);
  std::vector<remat::SequentialStage> stages = {
      {"a", [a](const at::Tensor& x, const std::string&) mutable { return a(x).tanh() * 3 + 1; }, {a.ptr()}},
      {"b", [b](const at::Tensor& x, const std::string&) mutable { return torch::tanh(b(x)); }, {b.ptr()}}};
  remat::SequentialChain chain(std::move(stages), [](const at::Tensor& out) { return out.pow(2).mean(); });
  const at::Tensor x = torch::randn({64, 16});
  const int64_t activation = 64 * 16 * 4;
  const remat::CostTable reentrant = remat::profile_chain(chain, x, remat::ProfileOptions().repeats(1));
  const remat::CostTable stopped =
      remat::profile_chain(chain, x, remat::ProfileOptions().repeats(1), remat::CheckpointMode::non_reentrant);
  EXPECT_EQ(reentrant.stages[0].options[0].kept_bytes, 2 * activation) << "tanh's output and the stage's output";
  EXPECT_EQ(reentrant.stages[0].options[0].at_segment_end().kept_bytes, 2 * activation) << "no graph-only stage";
  EXPECT_EQ(stopped.stages[0].options[0].kept_bytes, 2 * activation);
  EXPECT_EQ(stopped.stages[0].options[0].at_segment_end().kept_bytes, activation) << "stopped after tanh";
  EXPECT_EQ(stopped.stages[1].options[0].at_segment_end().kept_bytes, activation) << "b ends with what it saves";
  EXPECT_NE(stopped.source.find("non-reentrant early stop"), std::string::npos);
}

// The profiler reads what a checkpoint adds to each stage off steps with the stages checkpointed:
// the forward inside a segment, the recompute's extra, the segment's own cost; all are seconds
// the simulator can charge (finite, not negative), and the last stage, never recomputed, has none.
TEST(RecomputeCost, TheProfilerMeasuresItInAStepForEveryStageButTheLast) {
  remat::install_cpu_memory_tracker();
  torch::manual_seed(0);
  nn::Sequential net;
  for (int i = 0; i < 6; ++i) net->push_back(nn::Linear(8, 8));
  remat::SequentialChain chain(net, [](const at::Tensor& out) { return out.sum(); });
  const at::Tensor x = torch::randn({2, 8});
  for (const auto mode : {remat::CheckpointMode::reentrant, remat::CheckpointMode::non_reentrant}) {
    SCOPED_TRACE(remat::to_string(mode));
    const remat::CostTable costs = remat::profile_chain(chain, x, remat::ProfileOptions().repeats(1), mode);
    for (const auto& s : costs.stages) {
      EXPECT_TRUE(std::isfinite(s.recompute_extra_seconds) && s.recompute_extra_seconds >= 0) << s.name;
      EXPECT_TRUE(std::isfinite(s.nograd_seconds) && s.nograd_seconds >= 0) << s.name;
    }
    EXPECT_EQ(costs.stages.back().recompute_extra_seconds, 0);
    EXPECT_TRUE(std::isfinite(costs.segment_seconds()) && costs.segment_forward_seconds >= 0 &&
                costs.segment_backward_seconds >= 0);
  }
}
