// remat/ops/attention.h: memory-efficient attention against plain attention (outputs, gradients, dropout with the
// same mask, exact kept bytes, the SDPA kernel), its device path forced on the CPU and compared bit for bit.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "base/torch_compat.h"
#include "ops/philox_keep.h"
#include "remat/checkpoint/checkpoint.h"
#include "remat/memory/memory.h"
#include "remat/ops/attention.h"
#include "remat/ops/dropout.h"
#include "support/compare.h"

namespace {

using remat::testing::same_bits;

using remat::ops::detail::ForceTensorKeepPath;

using remat::ops::AttentionKernel;
using remat::ops::AttentionOptions;

// softmax(q·kᵀ·scale [causal]) [* mask] · v, in plain LibTorch ops.
at::Tensor plain_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                           const at::Tensor& scale_mask = {}) {
  at::Tensor scores = q.matmul(k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(3)));
  if (causal) {
    scores = scores.masked_fill(torch::ones({q.size(2), k.size(2)}, torch::kBool).triu(1),
                                -std::numeric_limits<float>::infinity());
  }
  at::Tensor probs = scores.softmax(-1);
  if (scale_mask.defined()) probs = probs * scale_mask.view(probs.sizes());
  return probs.matmul(v);
}

// max |a - b| relative to max |b|.
double relative_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-30);
}

struct Case {
  int64_t batch, heads, queries, keys, head_size, block_rows;
  bool causal;
};

void expect_matches_plain(const Case& c, double p = 0.0) {
  torch::manual_seed(3);
  auto make = [&](int64_t length) { return torch::randn({c.batch, c.heads, length, c.head_size}).requires_grad_(); };
  at::Tensor q = make(c.queries), k = make(c.keys), v = make(c.keys);
  at::Tensor upstream = torch::randn({c.batch, c.heads, c.queries, c.head_size});

  torch::manual_seed(11);
  at::Tensor mask;
  if (p > 0) {
    mask = remat::ops::dropout_scale(remat::ops::draw_dropout_seed(), {c.batch * c.heads, c.queries, c.keys}, p);
  }
  torch::manual_seed(11);  // the operation draws the same seed
  at::Tensor fused = remat::ops::attention(
      q, k, v,
      AttentionOptions().causal(c.causal).dropout(p).block_rows(c.block_rows).kernel(AttentionKernel::blocked));
  auto fused_grads = torch::autograd::grad({fused}, {q, k, v}, {upstream});
  at::Tensor plain = plain_attention(q, k, v, c.causal, mask);
  auto plain_grads = torch::autograd::grad({plain}, {q, k, v}, {upstream});

  const std::string what = "B" + std::to_string(c.batch) + " H" + std::to_string(c.heads) + " Tq" +
                           std::to_string(c.queries) + " Tk" + std::to_string(c.keys) + " D" +
                           std::to_string(c.head_size) + " rows " + std::to_string(c.block_rows) +
                           (c.causal ? " causal" : "") + " p " + std::to_string(p);
  ASSERT_EQ(fused.sizes(), plain.sizes()) << what;
  EXPECT_LE(relative_difference(fused, plain), 1e-5) << what << ": output";
  const char* names[] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i)
    EXPECT_LE(relative_difference(fused_grads[i], plain_grads[i]), 1e-5) << what << ": " << names[i];
}

const Case kCases[] = {
    {2, 3, 37, 37, 8, 8, true},                              // T not a multiple of the block
    {2, 3, 37, 37, 8, 8, false},  {1, 1, 5, 5, 1, 2, true},  // one head, head size 1
    {1, 1, 5, 5, 1, 0, false},                               // automatic block: one block
    {3, 2, 7, 11, 4, 3, false},                              // cross attention: more keys than queries
    {2, 4, 64, 64, 16, 16, true},                            // blocks that divide T
    {1, 2, 33, 33, 5, 1, true},                              // one row per block
};

}  // namespace

TEST(MemoryEfficientAttention, OutputAndGradientsEqualPlainAttention) {
  for (const Case& c : kCases) expect_matches_plain(c);
}

TEST(MemoryEfficientAttention, WithDropoutEqualsPlainAttentionUnderTheSameMask) {
  for (const Case& c : kCases) expect_matches_plain(c, 0.3);
}

TEST(MemoryEfficientAttention, TheSameSeedGivesTheSameOutputAndGradientsTwice) {
  torch::manual_seed(5);
  at::Tensor q = torch::randn({2, 2, 19, 4}).requires_grad_(), k = torch::randn({2, 2, 19, 4}).requires_grad_(),
             v = torch::randn({2, 2, 19, 4}).requires_grad_();
  auto run = [&] {
    torch::manual_seed(42);
    at::Tensor y = remat::ops::attention(q, k, v, AttentionOptions().causal(true).dropout(0.2).block_rows(4));
    auto grads = torch::autograd::grad({y.square().sum()}, {q, k, v});
    grads.insert(grads.begin(), y);
    return grads;
  };
  const auto first = run(), second = run();
  for (size_t i = 0; i < first.size(); ++i) EXPECT_TRUE(first[i].equal(second[i])) << i;
  torch::manual_seed(43);
  at::Tensor other = remat::ops::attention(q, k, v, AttentionOptions().causal(true).dropout(0.2).block_rows(4));
  EXPECT_FALSE(other.equal(first[0])) << "another seed, another mask";
}

TEST(MemoryEfficientAttention, NotTrainingMeansNoDropout) {
  torch::manual_seed(1);
  at::Tensor q = torch::randn({1, 2, 9, 4}), k = torch::randn({1, 2, 9, 4}), v = torch::randn({1, 2, 9, 4});
  at::Tensor y = remat::ops::attention(q, k, v, AttentionOptions().causal(true).dropout(0.5).training(false));
  EXPECT_LE(relative_difference(y, plain_attention(q, k, v, true)), 1e-5);
}

TEST(MemoryEfficientAttention, KeepsOnlyItsOutputAndOneNumberPerRow) {
  remat::install_cpu_memory_tracker();
  for (const int64_t T : {64, 128}) {
    at::Tensor q = torch::randn({2, 4, T, 16}).requires_grad_(), k = torch::randn({2, 4, T, 16}).requires_grad_(),
               v = torch::randn({2, 4, T, 16}).requires_grad_();
    const int64_t before = remat::memory_stats().current_bytes;
    at::Tensor y =
        remat::ops::attention(q, k, v, AttentionOptions().causal(true).dropout(0.1).kernel(AttentionKernel::blocked));
    const int64_t kept = remat::memory_stats().current_bytes - before;
    // The output (B,T,H,D) and the log-sum-exp (B·H,T), fp32: no B·H·T² term.
    EXPECT_EQ(kept, 2 * T * 4 * 16 * 4 + 2 * 4 * T * 4) << "T " << T;
    y.sum().backward();
    EXPECT_TRUE(q.grad().defined() && k.grad().defined() && v.grad().defined());
  }
}

TEST(MemoryEfficientAttention, RejectsBadInputClearly) {
  at::Tensor q = torch::randn({1, 2, 5, 4}), k = torch::randn({1, 2, 6, 4});
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  EXPECT_NE(
      message([&] { remat::ops::attention(q, k, k, AttentionOptions().causal(true)); }).find("as many queries as keys"),
      std::string::npos);
  EXPECT_NE(message([&] { remat::ops::attention(q.view({2, 5, 4}), k, k); }).find("4-dimensional"), std::string::npos);
  EXPECT_NE(message([&] { remat::ops::attention(q, k, k.narrow(2, 0, 5)); }).find("same shape"), std::string::npos);
  EXPECT_NE(message([&] { remat::ops::attention(q, k, k, AttentionOptions().dropout(1.0)); }).find("[0, 1)"),
            std::string::npos);
  EXPECT_NE(message([&] { remat::ops::attention(q.to(torch::kLong), k, k); }).find("floating-point"),
            std::string::npos);
}

// LibTorch 2.1+: `automatic` runs scaled_dot_product_attention where it has a fused kernel (on CPU:
// without dropout), with plain attention's values and gradients; a checkpoint's recompute of its
// dropout (forced, LibTorch's math kernel on CPU) draws the same masks. 1.13 has no SDPA.
TEST(MemoryEfficientAttention, AutomaticKernelIsSdpaWhereLibTorchHasAFusedOne) {
  torch::manual_seed(2);
  at::Tensor q = torch::randn({2, 3, 37, 8}).requires_grad_(), k = torch::randn({2, 3, 37, 8}).requires_grad_(),
             v = torch::randn({2, 3, 37, 8}).requires_grad_();
  const auto no_dropout = AttentionOptions().causal(true);
  const auto sdpa_dropout = AttentionOptions().causal(true).dropout(0.3).kernel(AttentionKernel::sdpa);
#if REMAT_TORCH_AT_LEAST(2, 1)
  EXPECT_EQ(remat::ops::attention_kernel(q, k, v, no_dropout), AttentionKernel::sdpa);
  EXPECT_EQ(remat::ops::attention_kernel(q, k, v, AttentionOptions().causal(true).dropout(0.1)),
            AttentionKernel::blocked)
      << "on CPU, SDPA with dropout is its math kernel: it keeps the probabilities";
  const at::Tensor upstream = torch::randn({2, 3, 37, 8});
  const at::Tensor y = remat::ops::attention(q, k, v, no_dropout), plain = plain_attention(q, k, v, true);
  EXPECT_LE(relative_difference(y, plain), 1e-5);
  const auto grads = torch::autograd::grad({y}, {q, k, v}, {upstream});
  const auto plain_grads = torch::autograd::grad({plain}, {q, k, v}, {upstream});
  for (int i = 0; i < 3; ++i) EXPECT_LE(relative_difference(grads[i], plain_grads[i]), 1e-5) << i;
  for (const auto mode : {remat::CheckpointMode::reentrant, remat::CheckpointMode::non_reentrant}) {
    auto fn = [&](const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{remat::ops::attention(in[0], in[1], in[2], sdpa_dropout)};
    };
    torch::manual_seed(9);
    const auto direct = torch::autograd::grad(fn({q, k, v}), {q, k, v}, {upstream});
    torch::manual_seed(9);
    const auto checkpointed = torch::autograd::grad(
        remat::checkpoint(fn, {q, k, v}, remat::CheckpointOptions().mode(mode)), {q, k, v}, {upstream});
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(direct[i].equal(checkpointed[i])) << remat::to_string(mode) << " " << i;
  }
#else
  EXPECT_EQ(remat::ops::attention_kernel(q, k, v, no_dropout), AttentionKernel::blocked);
  try {
    remat::ops::attention(q, k, v, sdpa_dropout);
    ADD_FAILURE() << "the sdpa kernel was accepted on LibTorch 1.13";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("needs LibTorch 2.1"), std::string::npos) << e.what();
  }
#endif
}

TEST(MemoryEfficientAttention, RefusesDoubleBackwardClearly) {
  at::Tensor q = torch::randn({1, 1, 4, 2}).requires_grad_();
  at::Tensor y = remat::ops::attention(q, q, q, AttentionOptions().kernel(AttentionKernel::blocked));
  auto grads = torch::autograd::grad({y.sum()}, {q}, {}, /*retain_graph=*/true, /*create_graph=*/false);
  EXPECT_TRUE(grads[0].defined());
  EXPECT_THROW(torch::autograd::grad({y.sum()}, {q}, {}, true, /*create_graph=*/true), c10::Error);
}

TEST(MemoryEfficientAttention, TheDevicePathMasksAsTheCpuLoopBitwise) {
  // Only the masks' drawing differs between the paths, so outputs and gradients agree to the bit.
  for (const Case& c : kCases) {
    SCOPED_TRACE("B" + std::to_string(c.batch) + " Tq" + std::to_string(c.queries) + " Tk" + std::to_string(c.keys) +
                 " rows " + std::to_string(c.block_rows) + (c.causal ? " causal" : ""));
    torch::manual_seed(3);
    auto make = [&](int64_t length) { return torch::randn({c.batch, c.heads, length, c.head_size}).requires_grad_(); };
    at::Tensor q = make(c.queries), k = make(c.keys), v = make(c.keys);
    const at::Tensor upstream = torch::randn({c.batch, c.heads, c.queries, c.head_size});
    auto run = [&] {
      torch::manual_seed(11);
      const auto options =
          AttentionOptions().causal(c.causal).dropout(0.3).block_rows(c.block_rows).kernel(AttentionKernel::blocked);
      at::Tensor y = remat::ops::attention(q, k, v, options);
      auto outs = torch::autograd::grad({y}, {q, k, v}, {upstream});
      outs.insert(outs.begin(), y);
      return outs;
    };
    const auto by_loop = run();
    ForceTensorKeepPath tensor_ops;
    const auto by_tensor_ops = run();
    for (size_t i = 0; i < by_loop.size(); ++i) EXPECT_TRUE(same_bits(by_loop[i], by_tensor_ops[i])) << i;
  }
}
