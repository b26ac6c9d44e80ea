// remat::ops: memory-efficient attention against plain attention (outputs, gradients, dropout with
// the same mask, exact kept bytes), and the regenerated dropout (repeatable, unbiased, 0 bytes kept).
#include <cmath>
#include <limits>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/memory.h"
#include "remat/ops/attention.h"
#include "remat/ops/dropout.h"

namespace {

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
  at::Tensor fused = remat::ops::attention(q, k, v, AttentionOptions().causal(c.causal).dropout(p).block_rows(c.block_rows));
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
  for (int i = 0; i < 3; ++i) EXPECT_LE(relative_difference(fused_grads[i], plain_grads[i]), 1e-5) << what << ": " << names[i];
}

const Case kCases[] = {
    {2, 3, 37, 37, 8, 8, true},     // T not a multiple of the block
    {2, 3, 37, 37, 8, 8, false},
    {1, 1, 5, 5, 1, 2, true},       // one head, head size 1
    {1, 1, 5, 5, 1, 0, false},      // automatic block: one block
    {3, 2, 7, 11, 4, 3, false},     // cross attention: more keys than queries
    {2, 4, 64, 64, 16, 16, true},   // blocks that divide T
    {1, 2, 33, 33, 5, 1, true},     // one row per block
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
    at::Tensor y = remat::ops::attention(q, k, v, AttentionOptions().causal(true).dropout(0.1));
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
  EXPECT_NE(message([&] { remat::ops::attention(q, k, k, AttentionOptions().causal(true)); }).find("as many queries as keys"),
            std::string::npos);
  EXPECT_NE(message([&] { remat::ops::attention(q.view({2, 5, 4}), k, k); }).find("4-dimensional"), std::string::npos);
  EXPECT_NE(message([&] { remat::ops::attention(q, k, k.narrow(2, 0, 5)); }).find("same shape"), std::string::npos);
  EXPECT_NE(message([&] { remat::ops::attention(q, k, k, AttentionOptions().dropout(1.0)); }).find("[0, 1)"),
            std::string::npos);
  EXPECT_NE(message([&] { remat::ops::attention(q.to(torch::kLong), k, k); }).find("floating-point"), std::string::npos);
}

TEST(MemoryEfficientAttention, RefusesDoubleBackwardClearly) {
  at::Tensor q = torch::randn({1, 1, 4, 2}).requires_grad_();
  at::Tensor y = remat::ops::attention(q, q, q);
  auto grads = torch::autograd::grad({y.sum()}, {q}, {}, /*retain_graph=*/true, /*create_graph=*/false);
  EXPECT_TRUE(grads[0].defined());
  EXPECT_THROW(torch::autograd::grad({y.sum()}, {q}, {}, true, /*create_graph=*/true), c10::Error);
}

TEST(RegeneratedDropout, KeepsOneMinusPWithinFourSigma) {
  const double p = 0.1;
  const int64_t n = 1000000;
  at::Tensor scale = remat::ops::dropout_scale(1234, {n}, p);
  const double kept = scale.ne(0).sum().item<double>() / n;
  const double sigma = std::sqrt(p * (1 - p) / n);
  EXPECT_LE(std::abs(kept - (1 - p)), 4 * sigma) << "kept fraction " << kept;
  EXPECT_TRUE(scale.masked_select(scale.ne(0)).eq(static_cast<float>(1 / (1 - p))).all().item<bool>());
  // Any run of the stream is the same elements of it: a slice drawn alone equals the slice.
  EXPECT_TRUE(remat::ops::dropout_scale(1234, {7}, p).equal(scale.narrow(0, 0, 7)));
}

TEST(RegeneratedDropout, MultipliesByTheSeedsMaskForwardAndBackward) {
  torch::manual_seed(9);
  at::Tensor x = torch::randn({4, 33, 17}).requires_grad_();
  torch::manual_seed(21);
  const uint64_t seed = remat::ops::draw_dropout_seed();
  torch::manual_seed(21);
  at::Tensor y = remat::ops::dropout(x, 0.25, /*training=*/true);
  const at::Tensor mask = remat::ops::dropout_scale(seed, x.sizes(), 0.25);
  EXPECT_TRUE(y.equal(x * mask));
  at::Tensor upstream = torch::randn(x.sizes());
  y.backward(upstream);
  EXPECT_TRUE(x.grad().equal(upstream * mask));
  EXPECT_TRUE(remat::ops::dropout(x, 0.25, /*training=*/false).equal(x));
  EXPECT_THROW(remat::ops::dropout(x, -0.1, true), c10::Error);
}

TEST(RegeneratedDropout, KeepsNoBytesPerElement) {
  remat::install_cpu_memory_tracker();
  at::Tensor x = torch::randn({64, 1000}).requires_grad_();
  at::Tensor h = x * 2;  // keeps nothing (a constant factor)
  const int64_t before = remat::memory_stats().current_bytes;
  at::Tensor y = remat::ops::dropout(h, 0.1, true);
  EXPECT_EQ(remat::memory_stats().current_bytes - before, y.numel() * 4) << "only the output itself";
  at::Tensor plain = torch::dropout(h, 0.1, true);
  EXPECT_EQ(remat::memory_stats().current_bytes - before, 2 * y.numel() * 4 + plain.numel() * 4)
      << "LibTorch's dropout keeps a mask of the input's dtype besides its output";
}
