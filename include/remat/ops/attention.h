// remat/ops/attention.h — memory-efficient scaled dot-product attention: recomputation inside one
// operation.
//
//   at::Tensor y = remat::ops::attention(q, k, v, AttentionOptions().causal(true).dropout(0.1));
//
// Plain attention keeps, for backward, tensors of batch·heads·T² elements each: the scores'
// softmax, the dropout mask, the dropped-out probabilities. This operation keeps none of them —
// only q, k, v, its output, one log-sum-exp per query row (fp32) and a dropout seed — and recomputes
// the probabilities block by block in backward (FlashAttention's scheme, Dao et al. 2022). Its
// memory is linear in T. A block of query rows meets all (causal: all earlier) keys at once, so
// the softmax of a block is exact without an online rescaling, and the block's products are
// batched matrix products over batch·heads that BLAS runs at full speed; the block's rows are
// chosen so that its scores stay small (about 2 MiB), the only quadratic-in-T memory, and only
// while the block is processed. Causal attention skips the blocks above the diagonal: half the
// products of the plain version.
//
// Dropout on the probabilities is remat's regenerated dropout (ops/dropout.h): element (b·h, i, j)
// of the probabilities is element (b·h·T_q + i)·T_k + j of the seed's stream, so
// attention(...) == softmax(q·kᵀ·scale [causal mask]) * dropout_scale(seed, {B·H, T_q, T_k}, p) · v.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

namespace remat::ops {

/// What computes attention. `automatic`: LibTorch's scaled_dot_product_attention (2.1+) where it
/// picks a kernel that keeps no probabilities (flash, memory-efficient, cuDNN: on CPU only without
/// dropout, on CUDA also with it), else remat's blocked kernel below. `blocked`: always remat's.
/// `sdpa`: always LibTorch's, whichever kernel it picks (an error on 1.13). Under SDPA, dropout
/// draws from LibTorch's generator of the device, not from remat's Philox streams; a checkpoint's
/// recompute restores that generator, so its masks repeat there too.
enum class AttentionKernel { automatic, blocked, sdpa };

struct AttentionOptions {
  /// Query i attends to keys 0..i only (needs T_q == T_k).
  TORCH_ARG(bool, causal) = false;
  /// Dropout probability on the attention probabilities, applied when training.
  TORCH_ARG(double, dropout) = 0.0;
  TORCH_ARG(bool, training) = true;
  /// Multiplies q·kᵀ; 0 means 1/sqrt(head size).
  TORCH_ARG(double, scale) = 0.0;
  /// Query rows per block; 0 chooses about 2 MiB of fp32 scores per block.
  TORCH_ARG(int64_t, block_rows) = 0;
  TORCH_ARG(AttentionKernel, kernel) = AttentionKernel::automatic;
};

/// softmax(q·kᵀ·scale, masked if causal), dropped out, times v. q (B,H,T_q,D), k and v (B,H,T_k,D),
/// the same floating dtype and device; returns (B,H,T_q,D). The result is a transposed view of a
/// contiguous (B,T_q,H,D) tensor, so `.transpose(1, 2).reshape({B, T_q, H·D})` costs no copy.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionOptions& options = AttentionOptions());

/// The kernel attention() runs for these inputs and options: `blocked` or `sdpa`, never `automatic`.
AttentionKernel attention_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const AttentionOptions& options = AttentionOptions());

/// The query rows per block attention() uses for these sizes and options.
int64_t attention_block_rows(int64_t batch_heads, int64_t query_length, int64_t key_length,
                             const AttentionOptions& options);

}  // namespace remat::ops
