// Internal: CUDA caching-allocator statistics. Defined in cuda_memory.cpp on CUDA builds of
// LibTorch and in no_cuda_memory.cpp otherwise, so the rest of remat is the same on both.
#pragma once

#include <c10/core/Device.h>

#include "remat/memory/memory.h"

namespace remat::detail {

MemoryStats cuda_memory_stats(c10::Device device);
void reset_cuda_peak(c10::Device device);
void synchronize_if_cuda(c10::Device device);

}  // namespace remat::detail
