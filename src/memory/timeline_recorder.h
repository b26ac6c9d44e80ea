// Internal: the one recording memory timeline (memory_timeline.cpp), which the CPU tracking
// allocator (memory.cpp) feeds at every allocation and free.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

#include <c10/core/Device.h>

#include "remat/memory/memory_timeline.h"

namespace remat::detail {

// The one recording timeline. `active` is read without the lock on every allocation.
struct TimelineRecorder {
  std::atomic<bool> active{false};
  std::mutex mutex;
  c10::Device device{c10::kCPU};
  std::chrono::steady_clock::time_point start;
  std::vector<MemoryEvent> events;

  /// `device`: where the bytes were counted; a sample of another device's timeline is dropped.
  void record(int64_t bytes, c10::Device counted_on) {
    const StepPhase phase = current_step_phase();
    std::lock_guard<std::mutex> lock(mutex);
    if (!active || device != counted_on) return;
    events.push_back({std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), bytes, phase});
  }
};

// Never destroyed, like the tracking allocator (memory.cpp): tensors (and a runtime's own
// timeline, through the C interface) may still be freed during static destruction at exit.
TimelineRecorder& timeline_recorder();

}  // namespace remat::detail
