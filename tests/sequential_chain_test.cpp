// Planning any sequential model: SequentialChain, plan_for_budget, Planned and verify_plan on an
// MLP with dropout and a conv net with BatchNorm — exact gradients and statistics under every plan
// the planner makes, models left untouched by profiling, and clear errors for what cannot work.
#include <map>

#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/planning/budget_planner.h"
#include "remat/memory/memory.h"
#include "remat/measure/plan_measurement.h"
#include "remat/planning/profiler.h"
#include "remat/planning/planned.h"
#include "remat/chain/chain_state.h"
#include "remat/chain/policies.h"
#include "remat/chain/sequential_chain.h"
#include "remat/internal/statistics.h"
#include "support/compare.h"

namespace nn = torch::nn;
namespace F = torch::nn::functional;
using remat::testing::bitwise_equal;

namespace {

nn::Sequential mlp(int64_t layers = 6, int64_t width = 32) {
  torch::manual_seed(0);
  nn::Sequential net;
  for (int64_t i = 0; i < layers; ++i) {
    net->push_back(nn::Linear(width, 4 * width));
    net->push_back(nn::GELU());
    net->push_back(nn::Dropout(0.1));
    net->push_back(nn::Linear(4 * width, width));
  }
  net->push_back(nn::Linear(width, 10));
  return net;
}

nn::Sequential convnet() {
  torch::manual_seed(0);
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3, 8, 3).padding(1)), nn::BatchNorm2d(8), nn::ReLU(),
                        nn::Conv2d(nn::Conv2dOptions(8, 8, 3).padding(1)), nn::BatchNorm2d(8), nn::ReLU(),
                        nn::Conv2d(nn::Conv2dOptions(8, 8, 3).padding(1)), nn::BatchNorm2d(8), nn::ReLU(),
                        nn::Flatten(), nn::Linear(8 * 16 * 16, 10));
}

// Debian's LibTorch 2.6 runs these nets' convolutions through oneDNN, which on some CPUs (AMD EPYC
// with AVX-512, two threads) is not reproducible: two plain runs differ, even by NaN, without remat
// (docs/results.md). Tests comparing two runs bitwise need a reproducible reference: LibTorch's own
// convolution, for the test's duration.
struct ReproducibleConvolutions {
  bool was = at::globalContext().userEnabledMkldnn();
  ReproducibleConvolutions() { at::globalContext().setUserEnabledMkldnn(false); }
  ~ReproducibleConvolutions() { at::globalContext().setUserEnabledMkldnn(was); }
};

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

int count_segments(const std::vector<remat::PlanItem>& items) {
  int n = 0;
  for (const auto& item : items) n += item.is_stage() ? 0 : 1 + count_segments(item.segment);
  return n;
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
  remat::plan_for_budget(chain, x, "92%",
                         remat::BudgetPlanOptions().profile(remat::budget_profile_options().repeats(1)));
  EXPECT_TRUE(bitwise_equal(torch::rand({3}), expected_draw)) << "the RNG stream moved";
  remat::testing::expect_same_grads(grads, remat::testing::parameter_grads(*net));
  for (size_t i = 0; i < buffers.size(); ++i) EXPECT_TRUE(bitwise_equal(net->buffers()[i], buffers[i])) << i;
}

// The guard alone: whatever a measurement does to gradients, buffers and the RNG is undone, the
// gradients in place (an optimiser holding them sees the same tensors).
TEST(ChainStateGuard, PutsBackGradientsBuffersAndTheRngStream) {
  const ReproducibleConvolutions reproducible;
  nn::Sequential net = convnet();
  const at::Tensor x = torch::randn({4, 3, 16, 16});
  const at::Tensor y = torch::randint(0, 10, {4}, torch::kLong);
  remat::SequentialChain chain(net, [&y](const at::Tensor& out) { return F::cross_entropy(out, y); });
  const auto parameters = remat::chain_parameters(chain);
  ASSERT_EQ(parameters.size(), net->parameters().size());
  EXPECT_EQ(parameters.front().name, "0.weight");
  EXPECT_EQ(remat::chain_buffers(chain).size(), net->buffers().size());
  F::cross_entropy(net->forward(x), y).backward();
  const auto grads = remat::testing::parameter_grads(*net);
  const at::Tensor grad_tensor = net->parameters().front().grad();
  std::vector<at::Tensor> buffers;
  for (const auto& b : net->buffers()) buffers.push_back(b.clone());
  torch::manual_seed(9);
  const at::Tensor expected_draw = torch::rand({3});
  torch::manual_seed(9);
  {
    remat::ChainStateGuard untouched(chain, x);
    remat::run_plan(chain, remat::policy_plan("block", chain), x).backward();
    torch::rand({100});
    untouched.restore_rng();
    EXPECT_TRUE(bitwise_equal(torch::rand({3}), expected_draw)) << "restore_rng puts the stream back at once";
    net->parameters().back().mutable_grad() = at::Tensor();  // a gradient dropped inside
  }
  EXPECT_TRUE(bitwise_equal(torch::rand({3}), expected_draw)) << "the RNG stream moved";
  remat::testing::expect_same_grads(grads, remat::testing::parameter_grads(*net));
  EXPECT_TRUE(net->parameters().front().grad().is_same(grad_tensor)) << "restored in place";
  for (size_t i = 0; i < buffers.size(); ++i) EXPECT_TRUE(bitwise_equal(net->buffers()[i], buffers[i])) << i;
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

// Counts the stage runs profiling makes.
struct CountingChain : remat::SequentialChain {
  using remat::SequentialChain::SequentialChain;
  std::map<int64_t, int> runs;
  at::Tensor forward_stage(int64_t index, const at::Tensor& input, const std::string& option) override {
    ++runs[index];
    return remat::SequentialChain::forward_stage(index, input, option);
  }
};

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

// Short steps are timed as training runs them: each timed step of a plan follows an untimed step
// of the same plan, since a plan's first step after another's pays for that one's caches.
TEST(SequentialChain, MeasuredShortStepsEachFollowAStepOfTheirOwnPlan) {
  const at::Tensor x = torch::randn({4, 32});
  CountingChain chain(mlp(2), [](const at::Tensor& out) { return out.pow(2).mean(); });
  const int64_t last = chain.size() - 1;  // never in a segment: one run a step
  const remat::Plan plain = remat::Plan::plain(chain);
  const remat::Plan checkpointed = remat::policy_plan("block", chain);
  const int steps = 3;
  remat::measure_plans(chain, {plain}, x, steps);
  EXPECT_EQ(chain.runs[last], 1 + steps) << "one plan: a warm-up round, then its steps";
  chain.runs.clear();
  remat::measure_plans(chain, {plain, checkpointed}, x, steps);
  EXPECT_EQ(chain.runs[last], 2 * (1 + 2 * steps)) << "two plans: an untimed step before each timed one";
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

TEST(Planned, CalibratesOnItsFirstTrainingForwardAndKeepsParameterNames) {
  const ReproducibleConvolutions reproducible;
  nn::Sequential plain = convnet();
  remat::Planned planned(
      convnet(), "92%",
      remat::PlannedOptions().planning(remat::BudgetPlanOptions().profile(remat::budget_profile_options().repeats(1))));
  std::vector<std::string> plain_names, planned_names;
  for (const auto& p : plain->named_parameters()) plain_names.push_back(p.key());
  for (const auto& p : planned->named_parameters()) planned_names.push_back(p.key());
  EXPECT_EQ(plain_names, planned_names);
  EXPECT_EQ(plain->named_buffers().size(), planned->named_buffers().size());
  EXPECT_FALSE(planned->calibrated());
  REMAT_EXPECT_ERROR(planned->plan(), "not calibrated yet");

  const at::Tensor x = torch::randn({8, 3, 16, 16});
  const at::Tensor y = torch::randint(0, 10, {8}, torch::kLong);
  for (int step = 0; step < 3; ++step) {
    for (nn::Sequential net : {plain, planned->sequential()}) {
      net->zero_grad();
      torch::manual_seed(step);
      const at::Tensor out = net.ptr() == plain.ptr() ? plain->forward(x) : planned->forward(x);
      F::cross_entropy(out, y).backward();
    }
  }
  ASSERT_TRUE(planned->calibrated());
  SCOPED_TRACE("plan " + planned->plan().to_string() + " (" + to_string(planned->plan().mode) + ")");
  for (size_t i = 0; i < plain->parameters().size(); ++i) {
    EXPECT_TRUE(bitwise_equal(plain->parameters()[i], planned->parameters()[i])) << "calibration left parameter " << i;
  }
  EXPECT_LE(planned->budget_plan().measured_peak_bytes, planned->budget_plan().budget_bytes);
  EXPECT_GE(count_segments(planned->plan().items), 1) << planned->plan().to_string();
  remat::testing::expect_same_grads(remat::testing::parameter_grads(*plain), remat::testing::parameter_grads(*planned));
  for (size_t i = 0; i < plain->buffers().size(); ++i) {
    EXPECT_TRUE(bitwise_equal(plain->buffers()[i], planned->buffers()[i])) << i;
  }
  // A state saved from the plain model loads into the planned one.
  std::stringstream saved;
  torch::save(plain, saved);
  torch::load(planned, saved);

  // Another batch size changes every activation: refused, unless re-planning is asked for.
  REMAT_EXPECT_ERROR(
      planned->forward(torch::randn({2, 3, 16, 16})),
      "Planned: the plan was made for inputs of Float[8, 3, 16, 16] on cpu but this input is Float[2, 3, 16, 16]");
  planned->eval();
  EXPECT_EQ(planned->forward(torch::randn({2, 3, 16, 16})).sizes(), (std::vector<int64_t>{2, 10}))
      << "eval runs plainly";
  remat::Planned replanning(convnet(), "92%",
                            remat::PlannedOptions().replan_on_new_shape(true).planning(
                                remat::BudgetPlanOptions().profile(remat::budget_profile_options().repeats(1))));
  replanning->forward(x);
  const int64_t first_budget = replanning->budget_plan().unchecked.peak_bytes;
  replanning->forward(torch::randn({16, 3, 16, 16}));
  EXPECT_GT(replanning->budget_plan().unchecked.peak_bytes, first_budget);
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
  REMAT_EXPECT_ERROR(remat::plan_for_budget(unreduced, torch::randn({4, 32}), "50%"),
                     "the loss function must return a scalar (one element), got shape [4, 10]");

  // A budget below what any plan needs names the least feasible one.
  remat::SequentialChain reduced(net, [](const at::Tensor& out) { return out.pow(2).mean(); });
  REMAT_EXPECT_ERROR(
      remat::plan_for_budget(reduced, torch::randn({4, 32}), remat::Budget::bytes(1000),
                             remat::BudgetPlanOptions().profile(remat::budget_profile_options().repeats(1))),
      "no plan fits a budget of 1000 bytes (0.0 MiB): the smallest feasible budget is ");
  REMAT_EXPECT_ERROR(remat::Budget("12parsecs"), "has an unknown unit 'parsecs'");
  REMAT_EXPECT_ERROR(remat::SequentialChain(net, nullptr, remat::SequentialChainOptions().group_sizes({2, 2})),
                     "group_sizes must be positive and sum to the number of modules (9)");
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
      remat::profile_chain(chain, x, remat::ProfileOptions().repeats(1).mode(remat::CheckpointMode::non_reentrant));
  EXPECT_EQ(reentrant.stages[0].options[0].kept_bytes, 2 * activation) << "tanh's output and the stage's output";
  EXPECT_EQ(reentrant.stages[0].options[0].at_segment_end().kept_bytes, 2 * activation) << "no graph-only stage";
  EXPECT_EQ(stopped.stages[0].options[0].kept_bytes, 2 * activation);
  EXPECT_EQ(stopped.stages[0].options[0].at_segment_end().kept_bytes, activation) << "stopped after tanh";
  EXPECT_EQ(stopped.stages[1].options[0].at_segment_end().kept_bytes, activation) << "b ends with what it saves";
  EXPECT_NE(stopped.source.find("non-reentrant early stop"), std::string::npos);
}

namespace {

remat::PlannedOptions quick_planning() {
  return remat::PlannedOptions().planning(
      remat::BudgetPlanOptions().profile(remat::budget_profile_options().repeats(1)));
}

}  // namespace

// Issue 39: a module appended to the Sequential after the Planned was made was silently skipped.
TEST(Planned, RefusesASequentialChangedAfterItWasMade) {
  nn::Sequential net = mlp(1);
  remat::Planned planned(net, "100%", quick_planning());
  const at::Tensor x = torch::randn({4, 32});
  planned->forward(x).sum().backward();
  ASSERT_TRUE(planned->calibrated());
  net->push_back(nn::Linear(10, 3));
  const std::string changed = "the Sequential has changed since this Planned was made: it had 5 modules and now has 6";
  REMAT_EXPECT_ERROR(planned->forward(x), "Planned::forward: " + std::string(changed));
  REMAT_EXPECT_ERROR(planned->calibrate(x), "Planned::calibrate: " + std::string(changed));
  REMAT_EXPECT_ERROR(planned->forward(x), "first differing at module 5");
  REMAT_EXPECT_ERROR(planned->forward(x), "make a Planned of it");
  planned->eval();
  REMAT_EXPECT_ERROR(planned->forward(x), changed);  // evaluation skipped it as well
  // What the message advises: a Planned of the finished Sequential runs all its modules.
  remat::Planned fresh(net, "100%", quick_planning());
  const at::Tensor y = fresh->forward(x);
  EXPECT_EQ(y.size(1), 3) << "the appended module ran";
  y.sum().backward();
}

// Issue 39: calibrating on a batch of 0 rows was accepted.
TEST(Planned, RefusesToCalibrateOnABatchWithoutElements) {
  remat::Planned planned(mlp(1), "100%", quick_planning());
  const std::string empty = "the sample batch of shape Float[0, 32] on cpu has no elements (0 rows?)";
  REMAT_EXPECT_ERROR(planned->calibrate(torch::randn({0, 32})), "Planned::calibrate: " + empty);
  REMAT_EXPECT_ERROR(planned->forward(torch::randn({0, 32})), empty);
  REMAT_EXPECT_ERROR(planned->forward(torch::randn({0, 32})), "Calibrate on a batch of the size you train with");
  EXPECT_FALSE(planned->calibrated());
  planned->forward(torch::randn({4, 32})).sum().backward();
  EXPECT_TRUE(planned->calibrated());
}

// Issue 39: a Planned's first forward inside a checkpoint (its recompute, or a non-reentrant
// checkpoint's forward) ended in an internal error. It calibrates outside, on a thread of its own,
// and its gradients are the plain Sequential's.
TEST(Planned, ItsFirstForwardMayRunInsideACheckpointOfEitherMode) {
  for (const bool reentrant : {true, false}) {
    SCOPED_TRACE(reentrant ? "reentrant" : "non-reentrant");
    nn::Sequential plain = mlp(2);
    remat::Planned planned(mlp(2), "90%", quick_planning());
    const at::Tensor x = torch::randn({64, 32});
    const auto options = remat::CheckpointOptions().use_reentrant(reentrant);
    for (int step = 0; step < 2; ++step) {
      for (const bool is_planned : {false, true}) {
        torch::manual_seed(100 + step);
        const at::Tensor in = x.clone().requires_grad_(true);
        const at::Tensor out = remat::checkpoint(
            [&](const at::Tensor& t) { return is_planned ? planned->forward(t) : plain->forward(t); }, in, options);
        out.pow(2).sum().backward();
      }
      ASSERT_TRUE(planned->calibrated());
    }
    remat::testing::expect_same_grads(remat::testing::parameter_grads(*plain),
                                      remat::testing::parameter_grads(*planned));
  }
}

TEST(SequentialChain, RunPlanNeedsItsChainUntilBackwardAndSaysSoWhenItIsGone) {
  nn::Sequential net = mlp(2);
  const at::Tensor x = torch::randn({4, 32});
  std::vector<std::pair<std::string, at::Tensor>> reference;
  {
    remat::SequentialChain chain(net);
    torch::manual_seed(1);
    remat::run_plan(chain, remat::policy_plan("block", chain), x).sum().backward();
    reference = remat::testing::parameter_grads(*net);
  }
  // Made in a function that returns the loss, the chain is gone by backward.
  net->zero_grad();
  at::Tensor orphaned;
  {
    remat::SequentialChain chain(net);
    orphaned = remat::run_plan(chain, remat::policy_plan("block", chain), x);
  }
  REMAT_EXPECT_ERROR(orphaned.sum().backward(),
                     "run_plan: the chain was destroyed before backward recomputed its checkpointed segment");
  // Given as a shared_ptr, it is held until then.
  net->zero_grad();
  at::Tensor held;
  {
    auto chain = std::make_shared<remat::SequentialChain>(net);
    torch::manual_seed(1);
    held = remat::run_plan(chain, remat::policy_plan("block", *chain), x);
  }
  held.sum().backward();
  remat::testing::expect_same_grads(reference, remat::testing::parameter_grads(*net));
  REMAT_EXPECT_ERROR(remat::run_plan(std::shared_ptr<remat::Chain>(), remat::Plan(), x), "run_plan: the chain is null");

  // A copy is an object of its own, with a lifetime of its own.
  remat::SequentialChain original(net);
  std::weak_ptr<const void> of_copy;
  {
    remat::SequentialChain copy = original;
    of_copy = copy.lifetime();
    EXPECT_FALSE(of_copy.expired());
  }
  EXPECT_TRUE(of_copy.expired());
  EXPECT_FALSE(original.lifetime().expired());
}

TEST(Planned, ItsOutputStillBackPropagatesWhenThePlannedModuleIsGone) {
  const at::Tensor x = torch::randn({8, 3, 16, 16});
  nn::Sequential net = convnet();
  at::Tensor out;
  {
    remat::Planned planned(net, "92%",
                           remat::PlannedOptions().planning(
                               remat::BudgetPlanOptions().profile(remat::budget_profile_options().repeats(1))));
    out = planned->forward(x);
    ASSERT_GE(count_segments(planned->plan().items), 1) << planned->plan().to_string();
  }
  out.sum().backward();
  for (const auto& p : net->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_TRUE(torch::isfinite(p.grad()).all().item<bool>());
  }
}
