// remat/ops/dropout.h — dropout whose mask is regenerated, not stored.
//
//   at::Tensor y = remat::ops::dropout(x, 0.1, is_training());   // keeps 0 bytes per element
//
// LibTorch's dropout keeps its mask for backward (LibTorch 1.13 on CPU: a tensor of x's dtype, 4 bytes
// per fp32 element). This one keeps a 64-bit seed: element i of the tensor is kept when the i-th
// 32-bit output of the counter-based Philox4x32-10 generator (ATen's PhiloxRNGEngine) keyed by the
// seed is at least p·2³², and backward draws the same decisions again. The seed is one draw from
// LibTorch's default CPU generator, so torch::manual_seed makes runs repeatable and a checkpoint's
// recompute (which restores the generator) draws the same mask. Kept elements are scaled by 1/(1-p).
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

namespace remat::ops {

/// x with each element zeroed with probability p, the others scaled by 1/(1-p); the identity when
/// !training or p == 0. p in [0, 1). Floating-point x on any device; the decisions are drawn where x
/// is (on a GPU by tensor operations: no host loop, no copy), the same bits on every device.
at::Tensor dropout(const at::Tensor& x, double p, bool training);

/// One seed for a regenerated mask, drawn from LibTorch's default CPU generator.
uint64_t draw_dropout_seed();

/// x times the mask of `seed`, as dropout's forward and backward compute it (not recorded by
/// autograd): for code that keeps a seed and applies its mask later, bitwise as dropout would.
at::Tensor apply_dropout_mask(const at::Tensor& x, uint64_t seed, double p);

/// The scale the regenerated dropout multiplies element i of a contiguous tensor of `sizes` by:
/// 1/(1-p) (rounded to `dtype`) where kept, 0 where dropped; on CPU. dropout(x) == x * dropout_scale(
/// seed, x.sizes(), p, x.scalar_type()) with the seed dropout drew, bitwise. For tests and for code
/// that applies the same mask elsewhere.
at::Tensor dropout_scale(uint64_t seed, c10::IntArrayRef sizes, double p, at::ScalarType dtype = at::kFloat);

}  // namespace remat::ops
