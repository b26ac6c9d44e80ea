#include "remat/models/fused_ops.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

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
                               const at::Tensor& ln_bias, double eps, const at::Tensor& weight, const at::Tensor& bias) {
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

}  // namespace

at::Tensor layer_norm_linear(const at::Tensor& x, const at::Tensor& ln_weight, const at::Tensor& ln_bias, double eps,
                             const at::Tensor& weight, const at::Tensor& bias) {
  return LayerNormLinear::apply(x, ln_weight, ln_bias, eps, weight, bias)[0];
}

at::Tensor gelu_linear(const at::Tensor& u, const at::Tensor& weight, const at::Tensor& bias) {
  return GeluLinear::apply(u, weight, bias)[0];
}

}  // namespace remat::models
