// remat/chain/chain_state.h: a chain's parameters and buffers, and ChainStateGuard putting them and the RNG back.
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/chain/chain_state.h"
#include "remat/chain/plan.h"
#include "remat/chain/policies.h"
#include "remat/chain/sequential_chain.h"
#include "support/compare.h"
#include "support/sequential_models.h"

namespace nn = torch::nn;
namespace F = torch::nn::functional;
using remat::testing::bitwise_equal;
using remat::testing::convnet;
using remat::testing::ReproducibleConvolutions;

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
