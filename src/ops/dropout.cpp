#include "remat/ops/dropout.h"

#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/custom_function.h>

#include "ops/philox_keep.h"
#include "remat/error.h"

namespace remat::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Elements per parallel chunk: each chunk starts its own engine, so chunks need not be aligned.
constexpr int64_t kGrain = 1 << 14;

// t (contiguous, CPU) with the mask applied in place.
void apply_mask_(at::Tensor& t, uint64_t seed, double p) {
  const uint64_t threshold = detail::keep_threshold(p);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t.scalar_type(), "remat::ops::dropout", [&] {
    scalar_t* data = t.data_ptr<scalar_t>();
    const scalar_t scale = static_cast<scalar_t>(1.0 / (1.0 - p));
    at::parallel_for(0, t.numel(), kGrain, [&](int64_t begin, int64_t end) {
      detail::apply_keep(data + begin, seed, static_cast<uint64_t>(begin), end - begin, threshold, scale);
    });
  });
}

// x times the mask, as a new tensor. `differentiable`: through ATen ops autograd records (for
// double backward) instead of the in-place kernel.
at::Tensor masked(const at::Tensor& x, uint64_t seed, double p, bool differentiable) {
  if (differentiable || !x.device().is_cpu()) {
    return x.mul(dropout_scale(seed, x.sizes(), p, x.scalar_type()).to(x.device()));
  }
  at::Tensor out = x.clone(at::MemoryFormat::Contiguous);
  apply_mask_(out, seed, p);
  return out;
}

struct RegeneratedDropout : torch::autograd::Function<RegeneratedDropout> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, double p) {
    const uint64_t seed = draw_dropout_seed();
    ctx->saved_data["seed"] = static_cast<int64_t>(seed);
    ctx->saved_data["p"] = p;
    return {masked(x, seed, p, /*differentiable=*/false)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto seed = static_cast<uint64_t>(ctx->saved_data["seed"].toInt());
    const double p = ctx->saved_data["p"].toDouble();
    return {masked(grads[0], seed, p, /*differentiable=*/at::GradMode::is_enabled()), at::Tensor()};
  }
};

}  // namespace

uint64_t draw_dropout_seed() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return at::check_generator<at::CPUGeneratorImpl>(generator)->random64();
}

at::Tensor dropout_scale(uint64_t seed, c10::IntArrayRef sizes, double p, at::ScalarType dtype) {
  REMAT_CHECK(at::isFloatingType(dtype), "remat::ops::dropout_scale: the dtype must be floating-point.");
  at::Tensor scale = at::empty(sizes, at::TensorOptions().dtype(dtype));
  const uint64_t threshold = detail::keep_threshold(p);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "remat::ops::dropout_scale", [&] {
    const scalar_t kept = static_cast<scalar_t>(1.0 / (1.0 - p));
    scalar_t* data = scale.data_ptr<scalar_t>();
    at::parallel_for(0, scale.numel(), kGrain, [&](int64_t begin, int64_t end) {
      detail::for_each_keep(seed, static_cast<uint64_t>(begin), end - begin, threshold,
                            [&](int64_t i, bool keep) { data[begin + i] = keep ? kept : scalar_t(0); });
    });
  });
  return scale;
}

at::Tensor apply_dropout_mask(const at::Tensor& x, uint64_t seed, double p) {
  REMAT_CHECK(x.defined() && at::isFloatingType(x.scalar_type()),
              "remat::ops::apply_dropout_mask: takes a floating-point tensor.");
  return masked(x, seed, p, /*differentiable=*/false);
}

at::Tensor dropout(const at::Tensor& x, double p, bool training) {
  REMAT_CHECK(x.defined() && at::isFloatingType(x.scalar_type()),
              "remat::ops::dropout: takes a floating-point tensor, got ", x.defined() ? toString(x.scalar_type()) : "none",
              ".");
  detail::keep_threshold(p);  // checks p
  if (!training || p == 0.0) return x;
  return RegeneratedDropout::apply(x, p)[0];
}

}  // namespace remat::ops
