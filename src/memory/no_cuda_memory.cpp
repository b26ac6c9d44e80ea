#include "memory/cuda_memory.h"

#include "remat/base/error.h"

namespace remat::detail {

MemoryStats cuda_memory_stats(c10::Device device) {
  REMAT_CHECK(false, "memory statistics for ", device, " need remat built against a CUDA LibTorch.");
  return {};
}

void reset_cuda_peak(c10::Device device) {
  REMAT_CHECK(false, "memory statistics for ", device, " need remat built against a CUDA LibTorch.");
}

void synchronize_if_cuda(c10::Device /*device*/) {}

}  // namespace remat::detail
