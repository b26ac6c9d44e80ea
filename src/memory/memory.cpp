#include "remat/memory/memory.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <unordered_map>

#if defined(__GLIBC__)
#include <malloc.h>
#include <unistd.h>
#endif

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include "memory/cuda_memory.h"
#include "memory/timeline_recorder.h"
#include "base/torch_compat.h"
#include "remat/base/error.h"
#include "remat/memory/memory_timeline.h"

namespace remat {
namespace {

using detail::timeline_recorder;

// Counts bytes per live allocation. Sizes live in a side table keyed by pointer rather than in a
// DataPtr context because LibTorch's raw_allocate requires the context to be the data pointer.
class TrackingCpuAllocator final : public detail::AllocatorAcrossVersions<TrackingCpuAllocator> {
 public:
  c10::DataPtr allocate_bytes(size_t bytes) const { return allocate_tracked(bytes); }
  c10::DeleterFnPtr raw_deleter() const override { return &free_tracked; }

  static TrackingCpuAllocator& instance() {
    static auto* allocator = new TrackingCpuAllocator;  // outlives every tensor, even those freed at exit
    return *allocator;
  }

  MemoryStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return {current_, peak_};
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_ = current_;
  }

  void raise_peak(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes > peak_) peak_ = bytes;
  }

 private:
  c10::DataPtr allocate_tracked(size_t bytes) const {
    void* data = c10::alloc_cpu(bytes);
    if (data != nullptr) {
      std::lock_guard<std::mutex> lock(mutex_);
      sizes_[data] = bytes;
      current_ += static_cast<int64_t>(bytes);
      if (current_ > peak_) peak_ = current_;
      if (timeline_recorder().active) timeline_recorder().record(current_, c10::kCPU);
    }
    return {data, data, &free_tracked, c10::Device(c10::DeviceType::CPU)};
  }

  static void free_tracked(void* data) {
    if (data == nullptr) return;
    auto& self = instance();
    {
      std::lock_guard<std::mutex> lock(self.mutex_);
      auto it = self.sizes_.find(data);
      if (it != self.sizes_.end()) {
        self.current_ -= static_cast<int64_t>(it->second);
        self.sizes_.erase(it);
        if (timeline_recorder().active) timeline_recorder().record(self.current_, c10::kCPU);
      }
    }
    c10::free_cpu(data);
  }

  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, size_t> sizes_;
  mutable int64_t current_ = 0;
  mutable int64_t peak_ = 0;
};

std::once_flag tracker_installed_flag;
bool tracker_installed = false;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

void install_cpu_memory_tracker() {
  std::call_once(tracker_installed_flag, [] {
    // Priority above the default allocator's, so a later default registration cannot undo it.
    c10::SetCPUAllocator(&TrackingCpuAllocator::instance(), /*priority=*/100);
    tracker_installed = true;
  });
}

bool cpu_memory_tracker_installed() { return tracker_installed; }

MemoryStats memory_stats(c10::Device device) {
  if (device.is_cuda()) return detail::cuda_memory_stats(device);
  REMAT_CHECK(device.is_cpu(), "memory_stats: device ", device, " is not supported; use CPU or CUDA.");
  REMAT_CHECK(tracker_installed,
              "memory_stats: the CPU memory tracker is not installed; call "
              "remat::install_cpu_memory_tracker() before allocating the tensors to measure.");
  return TrackingCpuAllocator::instance().stats();
}

void synchronize_device(c10::Device device) { detail::synchronize_if_cuda(device); }

void reset_peak_memory(c10::Device device) {
  if (device.is_cuda()) return detail::reset_cuda_peak(device);
  REMAT_CHECK(device.is_cpu(), "reset_peak_memory: device ", device, " is not supported; use CPU or CUDA.");
  TrackingCpuAllocator::instance().reset_peak();
}

void raise_peak_memory(int64_t bytes, c10::Device device) {
  if (device.is_cpu()) TrackingCpuAllocator::instance().raise_peak(bytes);
}

double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? static_cast<double>(pages) * static_cast<double>(page_size) : 0.0;
}

void check_fits_in_machine_memory(double bytes, const std::string& what, const std::string& how_to_fix) {
  const double available = physical_memory_bytes();
  if (available <= 0) return;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  std::ostringstream needed;
  needed << std::setprecision(3) << bytes / gib << " GiB";
  std::ostringstream has;
  has << std::setprecision(3) << available / gib << " GiB";
  REMAT_CHECK(bytes < 0.9 * available, what, " needs about ", needed.str(), " but this machine has ", has.str(), ". ",
              how_to_fix);
}

std::string format_bytes(int64_t bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << mebibytes(bytes) << " MiB";
  return os.str();
}

StepMeasurement measure_step(const std::function<at::Tensor()>& forward, c10::Device device) {
  StepMeasurement m;
  detail::synchronize_if_cuda(device);
  m.bytes_before_forward = memory_stats(device).current_bytes;
  reset_peak_memory(device);
  const auto start = std::chrono::steady_clock::now();
  at::Tensor loss;
  {
    StepPhaseScope phase(StepPhase::forward);
    loss = forward();
  }
  REMAT_CHECK(loss.defined() && loss.numel() == 1 && loss.requires_grad(),
              "measure_step: the forward must return a scalar loss that requires grad.");
  detail::synchronize_if_cuda(device);
  m.forward_seconds = seconds_since(start);
  m.bytes_at_end_of_forward = memory_stats(device).current_bytes;
  {
    StepPhaseScope phase(StepPhase::backward);
    loss.backward();
    detail::synchronize_if_cuda(device);
  }
  m.step_seconds = seconds_since(start);
  m.peak_bytes = memory_stats(device).peak_bytes;
  return m;
}

void keep_freed_memory_in_process() {
#if defined(__GLIBC__)
  // Both, or the trim threshold alone fixes the mmap threshold at 128 KiB (setting one turns off
  // glibc's raising it as large blocks are freed): every tensor above 128 KiB is then a fresh
  // mapping, faulted in page by page each step. 32 MiB is the most glibc's mallopt accepts on 64-bit.
  // Where a glibc refuses the first, the second alone would do harm: then neither.
  if (mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1) mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

}  // namespace remat
