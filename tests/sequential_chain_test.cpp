// remat/chain/sequential_chain.h: any Sequential as a chain (its stages, groups and functions with options), exact
// gradients and BatchNorm statistics under every plan, models left as they were, and clear errors.
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/autoplan/make_plan.h"
#include "remat/autoplan/planned.h"
#include "remat/chain/plan.h"
#include "remat/chain/policies.h"
#include "remat/chain/sequential_chain.h"
#include "remat/measure/plan_measurement.h"
#include "remat/measure/profiler.h"
#include "remat/planning/planner.h"
#include "support/compare.h"
#include "support/planning.h"
#include "support/sequential_models.h"

namespace nn = torch::nn;
namespace F = torch::nn::functional;
using remat::testing::bitwise_equal;
using remat::testing::convnet;
using remat::testing::count_segments;
using remat::testing::mlp;
using remat::testing::ReproducibleConvolutions;

namespace {

struct Outcome {
  std::vector<double> losses;
  std::vector<std::pair<std::string, at::Tensor>> grads;  // after the last step
  std::vector<at::Tensor> buffers;                        // after the last step
};

// `steps` forward+backward passes of `plan` (no update), each from seed s, on fixed data.
Outcome run_steps(nn::Sequential net, const remat::Plan* plan, const at::Tensor& x, const at::Tensor& y, int steps) {
  remat::SequentialChain chain(net, [&y](const at::Tensor& out) { return F::cross_entropy(out, y); });
  Outcome o;
  for (int s = 0; s < steps; ++s) {
    net->zero_grad();
    torch::manual_seed(100 + s);
    at::Tensor loss =
        plan ? remat::run_plan(chain, *plan, x) : chain.forward_stage(chain.size() - 1, net->forward(x), "full");
    loss.backward();
    o.losses.push_back(loss.item<double>());
  }
  o.grads = remat::testing::parameter_grads(*net);
  for (const auto& b : net->buffers()) o.buffers.push_back(b.clone());
  return o;
}

void expect_identical(const Outcome& a, const Outcome& b) {
  EXPECT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i)
    EXPECT_TRUE(bitwise_equal(a.grads[i].second, b.grads[i].second)) << a.grads[i].first;
  ASSERT_EQ(a.buffers.size(), b.buffers.size());
  for (size_t i = 0; i < a.buffers.size(); ++i)
    EXPECT_TRUE(bitwise_equal(a.buffers[i], b.buffers[i])) << "buffer " << i;
}

}  // namespace

TEST(SequentialChain, StagesAreTheModulesAndTheLoss) {
  nn::Sequential net = convnet();
  const at::Tensor y = torch::zeros({2}, torch::kLong);
  remat::SequentialChain chain(net, [&y](const at::Tensor& out) { return F::cross_entropy(out, y); });
  ASSERT_EQ(chain.size(), 12);
  EXPECT_EQ(chain.stages()[0].name, "conv2d0");
  EXPECT_EQ(chain.stages()[1].name, "batchnorm2d1");
  EXPECT_EQ(chain.stages()[11].name, "loss");
  EXPECT_EQ(chain.stages()[11].block, -1);
  EXPECT_EQ(chain.granularity(), "modules");
  EXPECT_EQ(chain.stage_parameter_names(1), (std::vector<std::string>{"1.weight", "1.bias"}));
  EXPECT_EQ(chain.stage_buffers(1).size(), 3u) << "running mean, variance and count";
  EXPECT_EQ(
      remat::policy_plan("block,skip-ends", chain).to_string(),
      "conv2d0 [batchnorm2d1] [relu2] [conv2d3] [batchnorm2d4] [relu5] [conv2d6] [batchnorm2d7] [relu8] [flatten9] "
      "linear10 loss");

  remat::SequentialChain grouped(net, nullptr, remat::SequentialChainOptions().group_sizes({3, 3, 3, 2}));
  EXPECT_EQ(grouped.size(), 4);
  EXPECT_EQ(grouped.granularity(), "modules:3+3+3+2");
  EXPECT_EQ(grouped.stages()[0].name, "conv2d0-relu2");
  EXPECT_EQ(remat::policy_plan("every:2", grouped).to_string(),
            "[conv2d0-relu2 conv2d3-relu5] [conv2d6-relu8 flatten9-linear10]");
}

TEST(SequentialChain, DynamicProgramPlansAtSeveralBudgetsGiveBitwiseEqualGradients) {
  const at::Tensor x = torch::randn({16, 32});
  const at::Tensor y = torch::randint(0, 10, {16}, torch::kLong);
  const Outcome plain = run_steps(mlp(), nullptr, x, y, 2);
  nn::Sequential net = mlp();
  remat::SequentialChain chain(net, [&y](const at::Tensor& out) { return F::cross_entropy(out, y); });
  const remat::CostTable costs = remat::profile_chain(chain, x, remat::ProfileOptions().repeats(1));
  const int64_t least = remat::least_feasible_budget(costs);
  ASSERT_GT(least, 0);
  std::set<std::string> seen;
  for (const char* budget : {"30%", "50%", "70%", "100%"}) {
    const remat::PlanResult p = remat::plan_optimal(costs, budget);
    if (!p.feasible) continue;  // below the least feasible budget on this model
    SCOPED_TRACE(std::string(budget) + ": " + p.plan.to_string());
    EXPECT_LE(p.prediction.peak_bytes, p.budget_bytes);
    seen.insert(p.plan.to_string());
    expect_identical(plain, run_steps(mlp(), &p.plan, x, y, 2));
  }
  EXPECT_GE(seen.size(), 2u) << "the budgets should give different plans";
  const remat::PlanResult tight = remat::plan_optimal(costs, remat::Budget::bytes(least + least / 50));
  ASSERT_TRUE(tight.feasible);
  EXPECT_GE(count_segments(tight.plan.items), 2);
  expect_identical(plain, run_steps(mlp(), &tight.plan, x, y, 2));
}

TEST(SequentialChain, BatchNormStatisticsUpdateOncePerStepUnderEveryPlan) {
  const ReproducibleConvolutions reproducible;
  const at::Tensor x = torch::randn({8, 3, 16, 16});
  const at::Tensor y = torch::randint(0, 10, {8}, torch::kLong);
  const Outcome plain = run_steps(convnet(), nullptr, x, y, 3);
  nn::Sequential net = convnet();
  remat::SequentialChain chain(net, [&y](const at::Tensor& out) { return F::cross_entropy(out, y); });
  const remat::CostTable costs = remat::profile_chain(chain, x, remat::ProfileOptions().repeats(1));
  std::vector<remat::Plan> plans = {remat::policy_plan("block", chain), remat::policy_plan("every:3", chain),
                                    remat::policy_plan("sqrt", chain)};
  for (const char* budget : {"80%", "90%"}) plans.push_back(remat::plan_optimal(costs, budget).ensure_feasible().plan);
  for (const auto& plan : plans) {
    SCOPED_TRACE(plan.to_string());
    const Outcome planned = run_steps(convnet(), &plan, x, y, 3);
    expect_identical(plain, planned);
    EXPECT_EQ(planned.buffers.back().item<int64_t>(), 3) << "num_batches_tracked of the last BatchNorm";
  }
}

TEST(SequentialChain, ProfilingAndPlanningLeaveTheModelAsItWas) {
  const ReproducibleConvolutions reproducible;
  nn::Sequential net = convnet();
  const at::Tensor x = torch::randn({8, 3, 16, 16});
  const at::Tensor y = torch::randint(0, 10, {8}, torch::kLong);
  remat::SequentialChain chain(net, [&y](const at::Tensor& out) { return F::cross_entropy(out, y); });
  F::cross_entropy(net->forward(x), y).backward();  // some gradients and statistics to keep
  const auto grads = remat::testing::parameter_grads(*net);
  std::vector<at::Tensor> buffers;
  for (const auto& b : net->buffers()) buffers.push_back(b.clone());
  torch::manual_seed(5);
  const at::Tensor expected_draw = torch::rand({3});
  torch::manual_seed(5);
  remat::make_plan(remat::PlanRequest::of_budget("92%").options(remat::testing::quick_planning()), {chain, x});
  EXPECT_TRUE(bitwise_equal(torch::rand({3}), expected_draw)) << "the RNG stream moved";
  remat::testing::expect_same_grads(grads, remat::testing::parameter_grads(*net));
  for (size_t i = 0; i < buffers.size(); ++i) EXPECT_TRUE(bitwise_equal(net->buffers()[i], buffers[i])) << i;
}

TEST(SequentialChain, StagesGivenAsFunctionsWithOptions) {
  torch::manual_seed(0);
  nn::Linear a(16, 16), b(16, 16);
  std::vector<remat::SequentialStage> stages = {
      {"a",
       [a](const at::Tensor& x, const std::string& option) mutable { return option == "twice" ? a(a(x)) : a(x); },
       {a.ptr()},
       {"once", "twice"}},
      {"b", [b](const at::Tensor& x, const std::string&) mutable { return torch::tanh(b(x)); }, {b.ptr()}}};
  remat::SequentialChain chain(std::move(stages), [](const at::Tensor& out) { return out.pow(2).mean(); });
  EXPECT_EQ(chain.granularity(), "stages");
  remat::Plan plan = remat::policy_plan("block", chain);
  plan.options[0] = "twice";
  EXPECT_EQ(plan.to_string(), "[a:twice] [b] loss");
  const at::Tensor x = torch::randn({4, 16});
  // verify_plan checks the checkpointing: against the same options unchecked ("twice", not the
  // default "once", which computes something else).
  EXPECT_TRUE(remat::verify_plan(chain, plan, x).bitwise_equal());
  plan.options[0] = "once";
  EXPECT_TRUE(remat::verify_plan(chain, plan, x).bitwise_equal());
  const at::Tensor once = remat::run_plan(chain, plan, x);
  plan.options[0] = "twice";
  EXPECT_FALSE(once.equal(remat::run_plan(chain, plan, x))) << "the options run different functions";
}

TEST(SequentialChain, WhatCannotWorkIsAClearError) {
  REMAT_EXPECT_ERROR(remat::SequentialChain(nn::Sequential()), "SequentialChain: the model has no modules");
  REMAT_EXPECT_ERROR(remat::Planned(nn::Sequential(), "50%"), "Planned: the Sequential has no modules");

  // An LSTM returns (output, (h, c)): not one tensor.
  nn::Sequential lstm(nn::LSTM(8, 8), nn::Linear(8, 8));
  remat::SequentialChain chain(lstm);
  REMAT_EXPECT_ERROR(remat::profile_chain(chain, torch::randn({3, 2, 8})),
                     "SequentialChain: module '0' (torch::nn::LSTMImpl) returned something other than one tensor");

  // A loss that is not a scalar.
  nn::Sequential net = mlp(2);
  remat::SequentialChain unreduced(net, [](const at::Tensor& out) { return out.pow(2); });
  REMAT_EXPECT_ERROR(remat::make_plan(remat::PlanRequest::of_budget("50%"), {unreduced, torch::randn({4, 32})}),
                     "the loss function must return a scalar (one element), got shape [4, 10]");

  // A budget below what any plan needs names the least feasible one.
  remat::SequentialChain reduced(net, [](const at::Tensor& out) { return out.pow(2).mean(); });
  REMAT_EXPECT_ERROR(
      remat::make_plan(
          remat::PlanRequest::of_budget(remat::Budget::bytes(1000)).options(remat::testing::quick_planning()),
          {reduced, torch::randn({4, 32})}),
      "no plan fits a budget of 1000 bytes (0.0 MiB): the smallest feasible budget is ");
  REMAT_EXPECT_ERROR(remat::Budget("12parsecs"), "has an unknown unit 'parsecs'");
  REMAT_EXPECT_ERROR(remat::SequentialChain(net, nullptr, remat::SequentialChainOptions().group_sizes({2, 2})),
                     "group_sizes must be positive and sum to the number of modules (9)");
}
