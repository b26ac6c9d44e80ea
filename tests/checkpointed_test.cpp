// Checkpointing modules: the Checkpointed wrapper and checkpoint_sequential.
#include <sstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/checkpoint/checkpointed.h"
#include "remat/chain/policies.h"
#include "remat/chain/sequential_chain.h"
#include "support/checks.h"
#include "support/compare.h"
#include "remat/models/layer_stack.h"

using remat::testing::error_of;

namespace {

// Counts its forward calls: a checkpointed forward runs twice (forward, recompute).
class CountingImpl : public torch::nn::Module {
 public:
  explicit CountingImpl(int64_t channels) : linear(register_module("linear", torch::nn::Linear(channels, channels))) {}
  at::Tensor forward(const at::Tensor& x) {
    ++calls;
    return linear(x).tanh();
  }
  torch::nn::Linear linear;
  int calls = 0;
};
TORCH_MODULE(Counting);

// Every test runs in both checkpoint modes (the guard sets the default the wrappers use).
class ModeSuite : public ::testing::TestWithParam<remat::CheckpointMode> {
 private:
  remat::CheckpointModeGuard mode_{GetParam()};
};
class Checkpointed : public ModeSuite {};
class CheckpointSequential : public ModeSuite {};

}  // namespace

INSTANTIATE_TEST_SUITE_P(Modes, Checkpointed,
                         ::testing::Values(remat::CheckpointMode::reentrant, remat::CheckpointMode::non_reentrant),
                         remat::testing::checkpoint_mode_name);
INSTANTIATE_TEST_SUITE_P(Modes, CheckpointSequential,
                         ::testing::Values(remat::CheckpointMode::reentrant, remat::CheckpointMode::non_reentrant),
                         remat::testing::checkpoint_mode_name);

TEST_P(Checkpointed, KeepsTheWrappedModulesParameterAndBufferNames) {
  torch::nn::Sequential plain(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::Linear(8, 2));
  remat::Checkpointed wrapped(plain);
  EXPECT_EQ(plain->named_parameters().keys(), wrapped->named_parameters().keys());
  EXPECT_EQ(plain->named_buffers().keys(), wrapped->named_buffers().keys());

  remat::models::ResidualLayer layer(8, 0.0);
  remat::Checkpointed wrapped_layer(layer);
  EXPECT_EQ(layer->named_parameters().keys(), wrapped_layer->named_parameters().keys());
}

TEST_P(Checkpointed, StateSavedFromThePlainModuleLoadsIntoTheWrappedOneAndBack) {
  torch::manual_seed(1);
  remat::models::ResidualLayer source(8, 0.1);
  torch::manual_seed(2);
  remat::models::ResidualLayer target_inner(8, 0.1);
  remat::Checkpointed target(target_inner);

  std::stringstream stream;
  torch::save(source, stream);
  torch::load(target, stream);
  for (const auto& p : source->named_parameters()) {
    EXPECT_TRUE(p.value().equal(target->named_parameters()[p.key()])) << p.key();
  }

  torch::manual_seed(3);
  remat::models::ResidualLayer back(8, 0.1);
  std::stringstream stream2;
  torch::save(target, stream2);
  torch::load(back, stream2);
  for (const auto& p : source->named_parameters()) {
    EXPECT_TRUE(p.value().equal(back->named_parameters()[p.key()])) << p.key();
  }
}

TEST_P(Checkpointed, GradientsEqualThePlainModuleAndCanBeSwitchedOff) {
  torch::manual_seed(0);
  remat::models::ResidualLayer layer(16, 0.2);
  Counting counting(16);
  remat::Checkpointed wrapped(torch::nn::Sequential(layer, counting));
  at::Tensor x = torch::randn({2, 5, 16});

  torch::manual_seed(9);
  torch::nn::Sequential plain(layer, counting);
  plain->forward(x).pow(2).sum().backward();
  auto expected = remat::testing::parameter_grads(*plain);
  plain->zero_grad();
  EXPECT_EQ(counting->calls, 1);

  torch::manual_seed(9);
  wrapped->forward(x).pow(2).sum().backward();
  remat::testing::expect_same_grads(expected, remat::testing::parameter_grads(*wrapped));
  EXPECT_EQ(counting->calls, 3) << "checkpointed: forward once more for the recompute";

  wrapped->set_enabled(false);
  wrapped->forward(x).pow(2).sum().backward();
  EXPECT_EQ(counting->calls, 4) << "disabled: no recompute";
}

TEST_P(Checkpointed, TrainAndEvalReachTheWrappedModule) {
  remat::models::ResidualLayer layer(4, 0.5);
  remat::Checkpointed wrapped(layer);
  wrapped->eval();
  EXPECT_FALSE(layer->is_training());
  wrapped->train();
  EXPECT_TRUE(layer->is_training());
}

TEST_P(Checkpointed, BatchNormRunningStatisticsUpdateOnce) {
  torch::manual_seed(0);
  torch::nn::BatchNorm1d plain_bn(4), wrapped_bn(4);
  remat::Checkpointed wrapped(wrapped_bn);
  at::Tensor x = torch::randn({32, 4}) * 2 + 1;
  plain_bn(x.clone().requires_grad_(true)).sum().backward();
  wrapped(x.clone().requires_grad_(true)).sum().backward();
  EXPECT_TRUE(plain_bn->running_mean.equal(wrapped_bn->running_mean));
  EXPECT_TRUE(plain_bn->running_var.equal(wrapped_bn->running_var));
  EXPECT_EQ(wrapped_bn->num_batches_tracked.item<int64_t>(), 1);
}

// A callable that owns its module (the holder captured by value) keeps it until backward, so a
// module made in a scope that has ended is still there for the recompute (`[&]` would dangle).
TEST_P(Checkpointed, ACallableOwningItsModuleKeepsItAliveUntilBackward) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({4, 8});
  Counting plain(8);
  at::Tensor plain_leaf = x.clone().requires_grad_(true);
  plain(plain_leaf).pow(2).sum().backward();
  at::Tensor leaf = x.clone().requires_grad_(true);
  at::Tensor y;
  std::weak_ptr<CountingImpl> seen;
  {
    Counting block(8);
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < block->parameters().size(); ++i) block->parameters()[i].copy_(plain->parameters()[i]);
    }
    seen = block.ptr();
    y = remat::checkpoint([block](const at::Tensor& v) mutable { return block->forward(v); }, leaf);
  }
  std::shared_ptr<CountingImpl> module = seen.lock();
  ASSERT_TRUE(module) << "the checkpoint keeps the module for its recompute";
  y.pow(2).sum().backward();
  EXPECT_EQ(module->calls, 2);
  module.reset();
  EXPECT_TRUE(remat::testing::bitwise_equal(plain_leaf.grad(), leaf.grad()));
  y = at::Tensor();
  EXPECT_TRUE(seen.expired()) << "and lets it go with the graph";
}

TEST_P(CheckpointSequential, FollowsPyTorchSegmentSemantics) {
  // 7 modules, 3 segments: size ⌊7/3⌋ = 2; modules 0-1 and 2-3 checkpointed, 4-6 plain.
  torch::nn::Sequential seq;
  std::vector<Counting> modules;
  for (int i = 0; i < 7; ++i) {
    modules.emplace_back(6);
    seq->push_back(modules.back());
  }
  at::Tensor x = torch::randn({2, 6}, torch::requires_grad());
  remat::checkpoint_sequential(seq, 3, x).sum().backward();
  std::vector<int> calls;
  for (const auto& m : modules) calls.push_back(m->calls);
  EXPECT_EQ(calls, (std::vector<int>{2, 2, 2, 2, 1, 1, 1}));
}

TEST_P(CheckpointSequential, OneSegmentCheckpointsNothingAndGradientsMatchForEverySegmentCount) {
  torch::manual_seed(0);
  torch::nn::Sequential seq;
  for (int i = 0; i < 5; ++i) seq->push_back(remat::models::ResidualLayer(8, 0.3));
  at::Tensor x = torch::randn({3, 4, 8});

  torch::manual_seed(5);
  at::Tensor leaf = x.clone().requires_grad_(true);
  seq->forward(leaf).pow(2).sum().backward();
  auto expected = remat::testing::parameter_grads(*seq);
  at::Tensor expected_input_grad = leaf.grad().clone();

  for (int64_t segments = 1; segments <= 5; ++segments) {
    seq->zero_grad();
    torch::manual_seed(5);
    at::Tensor leaf2 = x.clone().requires_grad_(true);
    remat::checkpoint_sequential(seq, segments, leaf2).pow(2).sum().backward();
    SCOPED_TRACE("segments = " + std::to_string(segments));
    EXPECT_TRUE(remat::testing::bitwise_equal(expected_input_grad, leaf2.grad()));
    remat::testing::expect_same_grads(expected, remat::testing::parameter_grads(*seq));
  }
}

TEST_P(CheckpointSequential, RejectsSegmentCountsOutsideOneToN) {
  torch::nn::Sequential seq(torch::nn::Linear(2, 2), torch::nn::Linear(2, 2));
  at::Tensor x = torch::randn({1, 2});
  for (int64_t bad : {0, -1, 3}) {
    const std::string message = error_of([&] { remat::checkpoint_sequential(seq, bad, x); });
    EXPECT_NE(message.find("segments must be between 1 and the number of modules (2), got " + std::to_string(bad)),
              std::string::npos)
        << message;
  }
  torch::nn::Sequential empty;
  EXPECT_NE(error_of([&] { remat::checkpoint_sequential(empty, 1, x); }).find("number of modules (0)"),
            std::string::npos);
}

// One segment rule: checkpoint_sequential and the `segments:K` policy cut the same ranges.
TEST(CheckpointSequential, TheSegmentsPolicyCutsWhereCheckpointSequentialDoes) {
  for (int64_t n = 1; n <= 9; ++n) {
    torch::nn::Sequential net;
    for (int64_t i = 0; i < n; ++i) net->push_back(torch::nn::Linear(2, 2));
    remat::SequentialChain chain(net);
    for (int64_t k = 1; k <= n; ++k) {
      const remat::Plan plan = remat::policy_plan("segments:" + std::to_string(k), chain);
      std::vector<std::pair<int64_t, int64_t>> cut;
      for (const auto& item : plan.items) {
        if (item.is_stage()) continue;
        const auto range = remat::stage_range(item.segment);
        cut.emplace_back(range.first, range.second + 1);
      }
      const auto rule = remat::checkpoint_sequential_segments(n, k);
      EXPECT_EQ(cut, rule) << "n = " << n << ", segments = " << k;
      ASSERT_EQ(static_cast<int64_t>(rule.size()), n / k > 0 ? k - 1 : 0);
      for (const auto& [begin, end] : rule) EXPECT_EQ(end - begin, n / k);  // PyTorch: ⌊n/k⌋ each
    }
  }
  REMAT_EXPECT_ERROR(remat::checkpoint_sequential_segments(3, 4), "segments must be between 1 and the number");
}
