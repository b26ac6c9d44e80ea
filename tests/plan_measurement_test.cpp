// remat/measure/plan_measurement.h: plans measured (each timed step after one of its own plan), paired time
// ratios, the fastest fitting plan, and verify_plan's per-parameter differences.
#include <optional>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/chain/plan.h"
#include "remat/chain/policies.h"
#include "remat/chain/sequential_chain.h"
#include "remat/internal/statistics.h"
#include "remat/measure/plan_measurement.h"
#include "support/compare.h"
#include "support/sequential_models.h"

namespace nn = torch::nn;
namespace F = torch::nn::functional;
using remat::testing::convnet;
using remat::testing::CountingChain;
using remat::testing::mlp;
using remat::testing::ReproducibleConvolutions;

TEST(PairedRatios, GiveTheMedianWithAnIntervalOfIt) {
  remat::PlanMeasurement a, b;
  for (int r = 0; r < 21; ++r) {
    b.all_step_seconds.push_back(1.0 + 0.01 * r);
    a.all_step_seconds.push_back((1.0 + 0.01 * r) * (1.2 + 0.01 * (r % 7 - 3)));
  }
  const remat::PairedRatio ratio = remat::paired_time_ratios(a, b);
  EXPECT_NEAR(ratio.median, 1.2, 1e-9);
  EXPECT_LT(ratio.low, ratio.median);
  EXPECT_GT(ratio.high, ratio.median);
  EXPECT_GE(ratio.low, 1.17 - 1e-9);
  EXPECT_LE(ratio.high, 1.23 + 1e-9);
  EXPECT_TRUE(ratio.contains(1.2));
  EXPECT_FALSE(ratio.contains(1.3));
  EXPECT_EQ(ratio.rounds, 21u);
}

// Times paired per round: a plan slower in every round is slower, whatever the drift between rounds;
// a ratio of medians would have called it faster here.
TEST(PlanMeasurement, PairedRatiosCancelDriftBetweenRounds) {
  auto measured = [](std::vector<double> seconds, int64_t peak) {
    remat::PlanMeasurement m;
    m.all_step_seconds = seconds;
    m.step_seconds = remat::median(seconds);
    m.activation_peak_bytes = peak;
    return m;
  };
  // The machine slows down from round 3 on; "small" is 10% slower than "none" in each round and the
  // faster "other" does not fit.
  const std::vector<remat::PlanMeasurement> plans = {
      measured({1.0, 1.0, 2.0, 2.0, 2.0}, 100), measured({1.1, 1.1, 1.1, 2.2, 2.2}, 50),
      measured({1.05, 1.05, 2.1, 2.1, 2.1}, 50), measured({1.0, 1.0, 1.0, 1.0, 1.0}, 80)};
  EXPECT_LT(plans[1].step_seconds, plans[0].step_seconds);  // the medians are fooled
  EXPECT_NEAR(remat::paired_time_ratio(plans[1], plans[0]), 1.1, 1e-12);
  EXPECT_NEAR(remat::paired_time_ratio(plans[2], plans[0]), 1.05, 1e-12);
  EXPECT_EQ(remat::fastest_fitting(plans, {1, 2, 3}, 60, 0), std::optional<size_t>(2));
  EXPECT_EQ(remat::fastest_fitting(plans, {1, 2, 3}, 90, 0), std::optional<size_t>(3));
  EXPECT_EQ(remat::fastest_fitting(plans, {1, 2, 3}, 10, 0), std::nullopt);
  REMAT_EXPECT_ERROR(remat::paired_time_ratio(plans[0], measured({1.0}, 1)), "same interleaved rounds (5 and 1 steps)");
  REMAT_EXPECT_ERROR(remat::fastest_fitting(plans, {7}, 60, 0), "candidate 7 is not one of the 4 measurements");
}

// Short steps are timed as training runs them: each timed step of a plan follows an untimed step
// of the same plan, since a plan's first step after another's pays for that one's caches.
TEST(SequentialChain, MeasuredShortStepsEachFollowAStepOfTheirOwnPlan) {
  const at::Tensor x = torch::randn({4, 32});
  CountingChain chain(mlp(2), [](const at::Tensor& out) { return out.pow(2).mean(); });
  const int64_t last = chain.size() - 1;  // never in a segment: one run a step
  const remat::Plan plain = remat::Plan::unchecked(chain);
  const remat::Plan checkpointed = remat::policy_plan("block", chain);
  const int steps = 3;
  remat::measure_plans(chain, {plain}, x, steps);
  EXPECT_EQ(chain.runs[last], 1 + steps) << "one plan: a warm-up round, then its steps";
  chain.runs.clear();
  remat::measure_plans(chain, {plain, checkpointed}, x, steps);
  EXPECT_EQ(chain.runs[last], 2 * (1 + 2 * steps)) << "two plans: an untimed step before each timed one";
}

TEST(VerifyPlan, ReportsPerParameterDifferencesAndCatchesANondeterministicStage) {
  const ReproducibleConvolutions reproducible;
  const at::Tensor x = torch::randn({8, 3, 16, 16});
  const at::Tensor y = torch::randint(0, 10, {8}, torch::kLong);
  nn::Sequential net = convnet();
  remat::SequentialChain chain(net, [&y](const at::Tensor& out) { return F::cross_entropy(out, y); });
  const remat::PlanVerification ok = remat::verify_plan(chain, remat::policy_plan("every:2", chain), x);
  EXPECT_TRUE(ok.bitwise_equal()) << ok.to_string();
  EXPECT_EQ(ok.gradients.size(), 14u);
  EXPECT_EQ(ok.gradients[0].name, "0.weight");
  EXPECT_EQ(ok.buffers.size(), 9u);

  // A stage whose recompute differs from its forward (a counter it reads and bumps): the
  // checkpointed gradient is wrong, and verify_plan shows which parameter it reaches.
  torch::manual_seed(0);
  nn::Linear first(8, 8), second(8, 8);
  auto calls = std::make_shared<int>(0);
  std::vector<remat::SequentialStage> stages = {
      {"drifting",
       [first, calls](const at::Tensor& in, const std::string&) mutable {
         return first(in) * static_cast<double>(++*calls);
       },
       {first.ptr()}},
      {"steady", [second](const at::Tensor& in, const std::string&) mutable { return second(in); }, {second.ptr()}}};
  remat::SequentialChain drifting(std::move(stages), [](const at::Tensor& out) { return out.sum(); });
  const remat::PlanVerification bad =
      remat::verify_plan(drifting, remat::policy_plan("block", drifting), torch::randn({2, 8}));
  EXPECT_FALSE(bad.bitwise_equal());
  EXPECT_GT(bad.max_gradient_difference(), 0);
  EXPECT_NE(bad.to_string().find("drifting.0.weight"), std::string::npos) << bad.to_string();
}
