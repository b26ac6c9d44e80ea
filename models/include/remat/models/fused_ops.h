// Fused operations that keep a matmul's input *unmaterialised*: the cheap operation before the
// matmul (LayerNorm, GELU) is recomputed in backward from what is kept anyway, instead of keeping
// its output for the matmul's weight gradient. The forward computes exactly what
// LayerNorm→Linear and GELU→Linear compute; the backward calls the same derivative kernels.
//
//   layer_norm_linear  keeps x, mean, rstd (not LN(x), B·T·C floats)
//   gelu_linear        keeps u           (not GELU(u), B·T·4C floats)
#pragma once

#include <ATen/core/Tensor.h>

namespace remat::models {

/// linear(layer_norm(x; ln_weight, ln_bias, eps), weight, bias) over the last dimension.
at::Tensor layer_norm_linear(const at::Tensor& x, const at::Tensor& ln_weight, const at::Tensor& ln_bias, double eps,
                             const at::Tensor& weight, const at::Tensor& bias);

/// linear(gelu(u), weight, bias) with the exact (erf) GELU.
at::Tensor gelu_linear(const at::Tensor& u, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace remat::models
