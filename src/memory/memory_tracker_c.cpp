// A C interface to remat's CPU memory tracker and memory timeline, built as a shared library
// (libremat_memory_tracker.so) so other runtimes that load the same LibTorch — Python's torch,
// through ctypes — count exact bytes the same way remat does:
//
//   import torch, ctypes
//   tracker = ctypes.CDLL("build/libremat_memory_tracker.so")
//   tracker.remat_install_cpu_memory_tracker()
//   tracker.remat_cpu_current_bytes.restype = ctypes.c_int64
//
// Functions that can fail return a negative number and leave the reason for remat_last_error().
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

#include "remat/memory/memory.h"
#include "remat/memory/memory_timeline.h"

namespace {
std::string last_error;
std::unique_ptr<remat::MemoryTimeline> timeline;
std::vector<std::unique_ptr<remat::StepPhaseScope>> phases;
}  // namespace

#define REMAT_C_API extern "C" __attribute__((visibility("default")))

REMAT_C_API void remat_install_cpu_memory_tracker() { remat::install_cpu_memory_tracker(); }

REMAT_C_API int64_t remat_cpu_current_bytes() { return remat::memory_stats(c10::kCPU).current_bytes; }

REMAT_C_API int64_t remat_cpu_peak_bytes() { return remat::memory_stats(c10::kCPU).peak_bytes; }

REMAT_C_API void remat_cpu_reset_peak() { remat::reset_peak_memory(c10::kCPU); }

REMAT_C_API const char* remat_last_error() { return last_error.c_str(); }

/// Starts recording a CPU memory timeline. 0 on success, -1 on error.
REMAT_C_API int remat_timeline_start() {
  try {
    timeline = std::make_unique<remat::MemoryTimeline>(c10::kCPU);
    return 0;
  } catch (const c10::Error& e) {
    last_error = e.what_without_backtrace();
    return -1;
  }
}

/// Stops the timeline and writes it as CSV (seconds,bytes,phase); the count of events, or -1.
REMAT_C_API int64_t remat_timeline_stop_and_save(const char* path) {
  if (!timeline) {
    last_error = "no timeline is recording: call remat_timeline_start() first.";
    return -1;
  }
  if (path == nullptr || *path == '\0') {
    last_error = "remat_timeline_stop_and_save: give a file name (the timeline keeps recording).";
    return -1;
  }
  const auto events = timeline->stop();
  timeline.reset();
  try {
    remat::write_memory_events_csv(events, path);
    return static_cast<int64_t>(events.size());
  } catch (const c10::Error& e) {
    last_error = e.what_without_backtrace();
    return -1;
  }
}

/// Enters a step phase (1 forward, 2 backward, 3 recompute) until the matching pop. 0, or -1.
REMAT_C_API int remat_push_step_phase(int phase) {
  if (phase < 0 || phase > 3) {
    last_error = "phase must be 0 (idle), 1 (forward), 2 (backward) or 3 (recompute).";
    return -1;
  }
  phases.push_back(std::make_unique<remat::StepPhaseScope>(static_cast<remat::StepPhase>(phase)));
  return 0;
}

REMAT_C_API int remat_pop_step_phase() {
  if (phases.empty()) {
    last_error = "no step phase to pop.";
    return -1;
  }
  phases.pop_back();
  return 0;
}
