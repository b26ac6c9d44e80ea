// remat/models/fused_ops.h: the fused operations compute the unfused values and gradients, graph-only included.
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/models/fused_ops.h"
#include "support/compare.h"

TEST(FusedOps, ComputeTheUnfusedValuesAndGradients) {
  torch::manual_seed(0);
  torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({8}));
  torch::nn::Linear up(8, 32), down(32, 8);
  {
    torch::NoGradGuard no_grad;  // non-trivial affine parameters, so their gradients are tested
    ln->weight.normal_();
    ln->bias.normal_();
  }
  at::Tensor x = torch::randn({3, 5, 8}, torch::requires_grad());

  auto grads = [&](bool fused) {
    for (auto* m : std::initializer_list<torch::nn::Module*>{ln.get(), up.get(), down.get()}) m->zero_grad();
    x.mutable_grad().reset();
    at::Tensor y = fused ? remat::models::gelu_linear(
                               remat::models::layer_norm_linear(x, ln->weight, ln->bias, 1e-5, up->weight, up->bias),
                               down->weight, down->bias)
                         : down(torch::gelu(up(ln(x))));
    y.pow(2).sum().backward();
    return std::vector<at::Tensor>{y.detach(),
                                   x.grad().clone(),
                                   ln->weight.grad().clone(),
                                   ln->bias.grad().clone(),
                                   up->weight.grad().clone(),
                                   up->bias.grad().clone(),
                                   down->weight.grad().clone(),
                                   down->bias.grad().clone()};
  };
  const auto unfused = grads(false), fused = grads(true);
  EXPECT_TRUE(remat::testing::bitwise_equal(unfused[0], fused[0])) << "the forward must be exactly the unfused one";
  for (size_t i = 1; i < unfused.size(); ++i) {
    EXPECT_TRUE(unfused[i].allclose(fused[i], 1e-5, 1e-6)) << "gradient " << i;
  }
}

TEST(Gpt, GraphOnlyComputesTheValueForStridedInputsAndDrawsNoMaskInEvaluation) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({2, 4, 8}), h = torch::randn({2, 4, 32});
  const at::Tensor w = torch::randn({8, 32}), b = torch::randn({8});
  // Not a (B,T,K) contiguous input: the expression is computed, value included.
  const at::Tensor strided = torch::randn({2, 32, 4}).transpose(1, 2);
  EXPECT_TRUE(remat::testing::bitwise_equal(
      remat::models::residual_linear_dropout_graph_only(x, strided, w, b, 0.1, false), x + at::linear(strided, w, b)));
  // Evaluation mode: no mask, and still no value.
  at::Tensor hg = h.clone().requires_grad_(true);
  at::Tensor y = remat::models::residual_linear_dropout_graph_only(x, hg, w, b, 0.1, /*training=*/false);
  EXPECT_EQ(y.sizes(), x.sizes());
  y.backward(torch::ones_like(x));
  EXPECT_TRUE(hg.grad().allclose(torch::ones({2, 4, 8}).matmul(w)));
}
