#include "remat/models/fused_ops.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "base/torch_compat.h"

#include "remat/ops/dropout.h"

namespace remat::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The gradients of y = a·Wᵀ + b given dy, as the linear layer's own backward computes them on
// the flattened (rows, features) views.
struct LinearGrads {
  at::Tensor input, weight, bias;
};

LinearGrads linear_backward(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& weight) {
  const at::Tensor g = grad_out.reshape({-1, grad_out.size(-1)});
  const at::Tensor a = input.reshape({-1, input.size(-1)});
  return {g.mm(weight).view(input.sizes()), g.t().mm(a), g.sum(0)};
}

struct LayerNormLinear : torch::autograd::Function<LayerNormLinear> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& ln_weight,
                               const at::Tensor& ln_bias, double eps, const at::Tensor& weight,
                               const at::Tensor& bias) {
    auto [normed, mean, rstd] = at::native_layer_norm(x, {x.size(-1)}, ln_weight, ln_bias, eps);
    ctx->save_for_backward({x, ln_weight, ln_bias, weight, mean, rstd});
    ctx->saved_data["eps"] = eps;
    return {at::linear(normed, weight, bias)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &ln_weight = saved[1], &ln_bias = saved[2], &weight = saved[3];
    const at::Tensor &mean = saved[4], &rstd = saved[5];
    const double eps = ctx->saved_data["eps"].toDouble();
    const at::Tensor normed = std::get<0>(at::native_layer_norm(x, {x.size(-1)}, ln_weight, ln_bias, eps));
    const LinearGrads linear = linear_backward(grad_outputs[0], normed, weight);
    auto [grad_x, grad_ln_weight, grad_ln_bias] = at::native_layer_norm_backward(
        linear.input, x, {x.size(-1)}, mean, rstd, ln_weight, ln_bias, {true, true, true});
    return {grad_x, grad_ln_weight, grad_ln_bias, at::Tensor(), linear.weight, linear.bias};
  }
};

struct GeluLinear : torch::autograd::Function<GeluLinear> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& u, const at::Tensor& weight,
                               const at::Tensor& bias) {
    ctx->save_for_backward({u, weight});
    return {at::linear(at::gelu(u), weight, bias)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &u = saved[0], &weight = saved[1];
    const LinearGrads linear = linear_backward(grad_outputs[0], at::gelu(u), weight);
    return {at::gelu_backward(linear.input, u), linear.weight, linear.bias};
  }
};

// The graph of x + dropout(h·Wᵀ + b): dropout's backward multiplies by the mask it drew (scaled
// by 1/(1-p)), the linear's needs h and W, the sum passes the gradient to both sides.
struct ResidualLinearGraphOnly : torch::autograd::Function<ResidualLinearGraphOnly> {
  /// `scaled_mask` empty: no dropout. The mask is kept in saved_data rather than saved, so that
  /// backward can free it as soon as it is applied, as autograd frees dropout's mask before the
  /// linear's backward runs (otherwise it would add to the peak of the segment's backward).
  /// `seed` >= 0 (with p): the regenerated dropout's mask instead, kept as its seed.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& h, const at::Tensor& weight,
                               const at::Tensor& /*bias: its gradient needs only the output's*/,
                               const c10::optional<at::Tensor>& scaled_mask, c10::optional<int64_t> seed, double p) {
    ctx->save_for_backward({h, weight});
    ctx->saved_data["dropout"] = scaled_mask.has_value();
    if (scaled_mask.has_value()) ctx->saved_data["scaled_mask"] = *scaled_mask;
    if (seed.has_value()) {
      ctx->saved_data["seed"] = *seed;
      ctx->saved_data["p"] = p;
    }
    return {at::zeros({}, x.options()).expand(x.sizes())};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor& grad = grad_outputs[0];
    at::Tensor grad_linear = grad;
    if (ctx->saved_data.count("seed") > 0) {  // as remat::ops::dropout's backward
      grad_linear = ops::apply_dropout_mask(grad, static_cast<uint64_t>(ctx->saved_data["seed"].toInt()),
                                            ctx->saved_data["p"].toDouble());
    } else if (ctx->saved_data["dropout"].toBool()) {
      auto mask = ctx->saved_data.find("scaled_mask");
      TORCH_CHECK(mask != ctx->saved_data.end(),
                  "remat: backward ran twice through a graph-only recompute (it frees its dropout mask)");
      grad_linear = grad * mask->second.toTensor();  // as dropout's backward
      ctx->saved_data.erase(mask);
    }
    const auto saved = ctx->get_saved_variables();
    const LinearGrads linear = linear_backward(grad_linear, saved[0], saved[1]);
    return {grad, linear.input, linear.weight, linear.bias, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

bool autocast_enabled() {
  return remat::detail::autocast_enabled(c10::DeviceType::CPU) ||
         remat::detail::autocast_enabled(c10::DeviceType::CUDA);
}

}  // namespace

at::Tensor residual_linear_dropout_graph_only(const at::Tensor& x, const at::Tensor& h, const at::Tensor& weight,
                                              const at::Tensor& bias, double p, bool training, bool regenerated) {
  const bool exact = !autocast_enabled() && h.dim() == 3 && h.is_contiguous() && x.dim() == 3 &&
                     x.size(0) == h.size(0) && x.size(1) == h.size(1) && weight.dim() == 2 &&
                     weight.size(0) == x.size(2) && bias.defined() && x.scalar_type() == h.scalar_type();
  if (!exact) {
    const at::Tensor y = at::linear(h, weight, bias);
    return x + (regenerated ? ops::dropout(y, p, training) : at::dropout(y, p, training));
  }
  c10::optional<at::Tensor> scaled_mask;  // none: dropout is the identity
  c10::optional<int64_t> seed;
  if (training && p > 0 && regenerated) {
    seed = static_cast<int64_t>(ops::draw_dropout_seed());  // as remat::ops::dropout draws it
  } else if (training && p > 0) {
    // Dropout of ones is the scaled mask itself (1·m/(1-p)), drawn by the same generator calls as
    // the dropout of the linear's output of this shape, dtype and device.
    scaled_mask = at::dropout(at::ones(x.sizes(), h.options()), p, /*train=*/true);
  }
  return ResidualLinearGraphOnly::apply(x, h, weight, bias, scaled_mask, seed, p)[0];
}

at::Tensor layer_norm_linear(const at::Tensor& x, const at::Tensor& ln_weight, const at::Tensor& ln_bias, double eps,
                             const at::Tensor& weight, const at::Tensor& bias) {
  return LayerNormLinear::apply(x, ln_weight, ln_bias, eps, weight, bias)[0];
}

at::Tensor gelu_linear(const at::Tensor& u, const at::Tensor& weight, const at::Tensor& bias) {
  return GeluLinear::apply(u, weight, bias)[0];
}

}  // namespace remat::models
