// Fused operations that keep a matmul's input *unmaterialised*: the cheap operation before the
// matmul (LayerNorm, GELU) is recomputed in backward from what is kept anyway, instead of keeping
// its output for the matmul's weight gradient. The forward computes exactly what
// LayerNorm→Linear and GELU→Linear compute; the backward calls the same derivative kernels.
//
//   layer_norm_linear  keeps x, mean, rstd (not LN(x), B·T·C floats)
//   gelu_linear        keeps u           (not GELU(u), B·T·4C floats)
//
// And one that computes only a graph, for the end of a segment recomputed for its backward
// (Chain::forward_stage_graph_only):
//   residual_linear_dropout_graph_only   x + dropout(linear(h)) without the linear's matmul
#pragma once

#include <ATen/core/Tensor.h>

namespace remat::models {

/// linear(layer_norm(x; ln_weight, ln_bias, eps), weight, bias) over the last dimension.
at::Tensor layer_norm_linear(const at::Tensor& x, const at::Tensor& ln_weight, const at::Tensor& ln_bias, double eps,
                             const at::Tensor& weight, const at::Tensor& bias);

/// linear(gelu(u), weight, bias) with the exact (erf) GELU.
at::Tensor gelu_linear(const at::Tensor& u, const at::Tensor& weight, const at::Tensor& bias);

/// x + dropout(linear(h, weight, bias), p, training), as its graph only: the matmul, the dropout's
/// product and the sum are not computed, since their backward needs just h, the weight and the
/// dropout mask. The mask is drawn as the dropout on the linear's output draws it (same generator
/// calls), so the gradients equal those of the computed expression. The returned tensor has the
/// sum's shape, dtype and device but holds no data (a broadcast zero): read it and you read zeros.
/// Falls back to computing the expression where the shortcut would not match it exactly (autocast
/// on; h not a contiguous (B,T,K) tensor). `regenerated`: the dropout is remat::ops::dropout (its
/// seed drawn as that draws it), not LibTorch's.
at::Tensor residual_linear_dropout_graph_only(const at::Tensor& x, const at::Tensor& h, const at::Tensor& weight,
                                              const at::Tensor& bias, double p, bool training,
                                              bool regenerated = false);

}  // namespace remat::models
