#include "detail/cuda_memory.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

namespace remat::detail {

namespace allocator = c10::cuda::CUDACachingAllocator;

MemoryStats cuda_memory_stats(c10::Device device) {
  const auto stats = allocator::getDeviceStats(device.has_index() ? device.index() : c10::cuda::current_device());
  const auto& allocated = stats.allocated_bytes[static_cast<size_t>(allocator::StatType::AGGREGATE)];
  return {allocated.current, allocated.peak};
}

void reset_cuda_peak(c10::Device device) {
  allocator::resetPeakStats(device.has_index() ? device.index() : c10::cuda::current_device());
}

void synchronize_if_cuda(c10::Device device) {
  if (device.is_cuda()) c10::cuda::device_synchronize();
}

}  // namespace remat::detail
