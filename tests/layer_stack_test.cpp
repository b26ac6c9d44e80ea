// The acceptance tests of the mechanism on a stack of 8 Transformer-like layers with dropout:
// every way of checkpointing gives the plain run's loss and gradients bit for bit (CPU kernels
// are deterministic and the recompute replays the forward's RNG), and per-layer checkpointing
// holds only the layer boundaries at the end of the forward.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/checkpoint/checkpointed.h"
#include "remat/memory/memory.h"
#include "support/compare.h"
#include "remat/models/layer_stack.h"

using remat::models::LayerStack;
using remat::models::StackMode;

namespace {

constexpr int64_t kLayers = 8, kBatch = 4, kTokens = 32, kChannels = 64;
constexpr double kDropout = 0.1;

struct RunResult {
  at::Tensor loss, input_grad;
  std::vector<std::pair<std::string, at::Tensor>> grads;
};

template <typename Forward>
RunResult run(LayerStack& stack, const at::Tensor& x, Forward&& forward) {
  stack->zero_grad();
  torch::manual_seed(42);
  at::Tensor leaf = x.clone().requires_grad_(true);
  at::Tensor loss = forward(leaf).pow(2).mean();
  loss.backward();
  return {loss.detach(), leaf.grad().clone(), remat::testing::parameter_grads(*stack)};
}

void expect_same(const RunResult& plain, const RunResult& other) {
  EXPECT_TRUE(remat::testing::bitwise_equal(plain.loss, other.loss));
  EXPECT_TRUE(remat::testing::bitwise_equal(plain.input_grad, other.input_grad));
  remat::testing::expect_same_grads(plain.grads, other.grads);
}

class LayerStackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::manual_seed(0);
    stack = LayerStack(kLayers, kChannels, kDropout);
    x = torch::randn({kBatch, kTokens, kChannels});
    plain = run(stack, x, [&](const at::Tensor& in) { return stack->forward(in, StackMode::plain); });
  }
  LayerStack stack{nullptr};
  at::Tensor x;
  RunResult plain;
};

}  // namespace

TEST_F(LayerStackTest, CheckpointPerLayerGivesThePlainGradientsBitwise) {
  expect_same(
      plain, run(stack, x, [&](const at::Tensor& in) { return stack->forward(in, StackMode::checkpoint_each_layer); }));
}

TEST_F(LayerStackTest, CheckpointSequentialGivesThePlainGradientsBitwise) {
  torch::nn::Sequential seq;
  for (auto& b : stack->blocks) seq->push_back(b);
  for (int64_t segments : {2, 3, 8}) {
    SCOPED_TRACE("segments = " + std::to_string(segments));
    expect_same(plain,
                run(stack, x, [&](const at::Tensor& in) { return remat::checkpoint_sequential(seq, segments, in); }));
  }
}

TEST_F(LayerStackTest, NestedCheckpointsGiveThePlainGradientsBitwise) {
  expect_same(plain, run(stack, x,
                         [&](const at::Tensor& in) { return stack->forward(in, StackMode::checkpoint_pairs_nested); }));
}

TEST_F(LayerStackTest, PerLayerCheckpointingHoldsOnlyLayerBoundariesAtTheEndOfForward) {
  remat::install_cpu_memory_tracker();  // after SetUp: only what the steps allocate counts
  at::Tensor input = x.clone().requires_grad_(true);
  auto measure = [&](StackMode mode) {
    stack->zero_grad();
    return remat::measure_step([&] { return stack->forward(input, mode).pow(2).mean(); });
  };
  const auto unchecked = measure(StackMode::plain);
  const auto checkpointed = measure(StackMode::checkpoint_each_layer);

  // Kept: each layer's output (the next layer's input, and the stack's output), the loss, and one
  // RNG state per checkpoint. Margin: 1 KiB per layer for small bookkeeping tensors.
  const int64_t boundary_bytes = kLayers * kBatch * kTokens * kChannels * 4;
  const int64_t rng_state_bytes = at::detail::getDefaultCPUGenerator().get_state().nbytes();
  const int64_t allowed = boundary_bytes + kLayers * rng_state_bytes + kLayers * 1024;
  EXPECT_LE(checkpointed.activation_bytes_at_end_of_forward(), allowed);
  EXPECT_GE(checkpointed.activation_bytes_at_end_of_forward(), boundary_bytes);
  EXPECT_GE(unchecked.activation_bytes_at_end_of_forward(), 3 * checkpointed.activation_bytes_at_end_of_forward());
  EXPECT_LT(checkpointed.activation_peak_bytes(), unchecked.activation_peak_bytes());
  std::cout << "end of forward: unchecked " << unchecked.activation_bytes_at_end_of_forward() << " B, checkpointed "
            << checkpointed.activation_bytes_at_end_of_forward() << " B (allowed " << allowed
            << "); peak: " << unchecked.activation_peak_bytes() << " vs " << checkpointed.activation_peak_bytes()
            << " B\n";
}
