// remat/ops/dropout.h: the regenerated dropout (repeatable, unbiased, 0 bytes kept), its Philox stream drawn by
// tensor operations, and its device path forced on the CPU and compared with the CPU loop bit for bit.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ops/philox_keep.h"
#include "remat/memory/memory.h"
#include "remat/ops/dropout.h"
#include "support/compare.h"

namespace {

using remat::testing::same_bits;

using remat::ops::detail::ForceTensorKeepPath;

}  // namespace

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

TEST(PhiloxByTensorOps, DrawsAtensEngineOutputsBitwise) {
  // Starts at every lane, a window across the carry of the counter's low word (element 2^34 is
  // counter 2^32), and far out in the stream.
  const std::vector<int64_t> starts = {0, 1, 2, 3, 4097, (int64_t{1} << 34) - 6, (int64_t{1} << 61) + 3};
  for (const uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{0x123456789abcdef0}, ~uint64_t{0}}) {
    for (const int64_t length : {1, 2, 3, 4, 5, 13, 64}) {
      const at::Tensor drawn = remat::ops::detail::philox_outputs(seed, torch::tensor(starts, torch::kLong), length);
      ASSERT_EQ(drawn.sizes(), (std::vector<int64_t>{static_cast<int64_t>(starts.size()), length}));
      const auto got = drawn.accessor<int64_t, 2>();
      for (size_t r = 0; r < starts.size(); ++r) {
        const auto first = static_cast<uint64_t>(starts[r]);
        at::philox_engine engine(seed, 0, first / 4);
        for (uint64_t skip = first % 4; skip > 0; --skip) engine();
        for (int64_t j = 0; j < length; ++j) {
          const uint32_t expected = engine();
          ASSERT_EQ(got[static_cast<int64_t>(r)][j], static_cast<int64_t>(expected))
              << "seed " << seed << ", element " << first + j;
        }
      }
    }
  }
}

TEST(RegeneratedDropout, TheDevicePathMasksAsTheCpuLoopBitwise) {
  // More elements than one device row (4096), and not a multiple of it; NaN, infinities and -0
  // where they may be dropped (the loop writes +0) or kept (scaled).
  for (const auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16}) {
    torch::manual_seed(4);
    at::Tensor x = torch::randn({3, 4101}).to(dtype);
    for (int64_t i = 0; i < 40; i += 4) {
      x[0][i].fill_(std::numeric_limits<double>::quiet_NaN());
      x[0][i + 1].fill_(-std::numeric_limits<double>::infinity());
      x[0][i + 2].fill_(-0.0);
    }
    for (const double p : {0.1, 0.5}) {
      for (const at::Tensor& input : {x, x.t()}) {  // contiguous, and element order by strides
        SCOPED_TRACE(std::string(toString(dtype)) + " p " + std::to_string(p) +
                     (input.is_contiguous() ? "" : " transposed"));
        const at::Tensor by_loop = remat::ops::apply_dropout_mask(input, 77, p);
        ForceTensorKeepPath tensor_ops;
        const at::Tensor by_tensor_ops = remat::ops::apply_dropout_mask(input, 77, p);
        EXPECT_TRUE(same_bits(by_loop, by_tensor_ops));
        EXPECT_TRUE(by_tensor_ops.is_contiguous());
      }
    }
  }
}

TEST(RegeneratedDropout, TheDevicePathDrawsLargeTensorsInGroupsAsTheLoop) {
  // Over 2^19 elements: more than one group of rows of the device path.
  torch::manual_seed(6);
  const at::Tensor x = torch::randn({600011});
  const at::Tensor by_loop = remat::ops::apply_dropout_mask(x, 123, 0.2);
  ForceTensorKeepPath tensor_ops;
  EXPECT_TRUE(same_bits(by_loop, remat::ops::apply_dropout_mask(x, 123, 0.2)));
}

TEST(RegeneratedDropout, TheDevicePathGivesTheLoopsGradientsAndSecondDerivatives) {
  torch::manual_seed(2);
  at::Tensor x = torch::randn({5, 999}).requires_grad_();
  at::Tensor w = torch::randn({5, 999}).requires_grad_();
  auto run = [&] {
    torch::manual_seed(8);
    const at::Tensor y = remat::ops::dropout(x, 0.3, /*training=*/true);
    const at::Tensor g = torch::autograd::grad({y}, {x}, {w}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    const at::Tensor gw = torch::autograd::grad({g.sum()}, {w})[0];  // the scaled mask itself
    return std::vector<at::Tensor>{y, g, gw};
  };
  const auto by_loop = run();
  ForceTensorKeepPath tensor_ops;
  const auto by_tensor_ops = run();
  for (size_t i = 0; i < by_loop.size(); ++i) EXPECT_TRUE(same_bits(by_loop[i], by_tensor_ops[i])) << i;
  EXPECT_TRUE(by_loop[2].ne(0).any().item<bool>() && by_loop[2].eq(0).any().item<bool>()) << "a mask, not a constant";
}
