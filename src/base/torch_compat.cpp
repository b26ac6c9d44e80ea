// The calls whose names or presence differ between LibTorch lines (declared in torch_compat.h).
#include "base/torch_compat.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#if REMAT_TORCH_AT_LEAST(2, 1)
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#endif

namespace remat::detail {

bool autocast_enabled(c10::DeviceType device) {
#if REMAT_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

c10::ScalarType autocast_dtype(c10::DeviceType device) {
#if REMAT_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                        : at::autocast::get_autocast_gpu_dtype();
#endif
}

void set_autocast(c10::DeviceType device, bool enabled, c10::ScalarType dtype) {
#if REMAT_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device, enabled);
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

int64_t fused_attention_backend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout,
                                bool causal, double scale) {
#if REMAT_TORCH_AT_LEAST(2, 1)
  return at::_fused_sdp_choice(q, k, v, c10::nullopt, dropout, causal, scale);
#else
  (void)q, (void)k, (void)v, (void)dropout, (void)causal, (void)scale;
  return -1;
#endif
}

at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout, bool causal,
                           double scale) {
#if REMAT_TORCH_AT_LEAST(2, 1)
  return at::scaled_dot_product_attention(q, k, v, c10::nullopt, dropout, causal, scale);
#else
  (void)q, (void)k, (void)v, (void)dropout, (void)causal, (void)scale;
  TORCH_CHECK(false, "scaled_dot_product_attention needs LibTorch 2.1 or later; this is ", TORCH_VERSION);
#endif
}

}  // namespace remat::detail
