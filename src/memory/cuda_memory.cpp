#include "memory/cuda_memory.h"

#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

namespace remat::detail {
namespace {

namespace allocator = c10::cuda::CUDACachingAllocator;

// The caching allocator has its devices once LibTorch has initialised CUDA, which it does lazily
// at the first CUDA tensor: before that (a timeline or a step measured before anything moved to the
// device) a query fails ("did you call init?"). 2.x names the initialisation lazyInitDevice, 1.13
// lazyInitCUDA (deprecated since); the first overload is taken where it compiles.
template <typename Context>
auto initialise_cuda(Context& context, int) -> decltype(context.lazyInitDevice(c10::DeviceType::CUDA)) {
  return context.lazyInitDevice(c10::DeviceType::CUDA);
}
template <typename Context>
void initialise_cuda(Context& context, long) {
  context.lazyInitCUDA();
}

c10::DeviceIndex index_of(c10::Device device) {
  initialise_cuda(at::globalContext(), 0);
  return device.has_index() ? device.index() : c10::cuda::current_device();
}

// Each statistic is an array over pools whose element 0 is their aggregate (StatType::AGGREGATE).
// The enum moved from CUDACachingAllocator to c10::CachingDeviceAllocator in 2.x; the layout did not.
constexpr size_t kAggregate = 0;

}  // namespace

MemoryStats cuda_memory_stats(c10::Device device) {
  const auto stats = allocator::getDeviceStats(index_of(device));
  const auto& allocated = stats.allocated_bytes[kAggregate];
  return {allocated.current, allocated.peak};
}

void reset_cuda_peak(c10::Device device) { allocator::resetPeakStats(index_of(device)); }

void synchronize_if_cuda(c10::Device device) {
  if (device.is_cuda()) c10::cuda::device_synchronize();
}

}  // namespace remat::detail
