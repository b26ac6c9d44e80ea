// remat/memory/memory_timeline.h — bytes held over one training step, with the phase of each moment.
//
//   remat::MemoryTimeline timeline;                 // starts recording
//   remat::measure_step([&] { return loss_of(x); });  // marks the forward and backward phases
//   std::vector<remat::MemoryEvent> events = timeline.stop();
//
// On CPU the tracking allocator (remat/memory/memory.h) records an event at every allocation and free; on
// CUDA, bytes are sampled at phase changes only (LibTorch 1.13's caching allocator has no per-call
// hook). A checkpoint's backward marks its re-run forward as `recompute`, so a plot shows where
// recomputation happens and what it holds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/Device.h>

namespace remat {

enum class StepPhase : int { idle = 0, forward = 1, backward = 2, recompute = 3 };
const char* to_string(StepPhase phase);

/// The phase this process is in (global: LibTorch's CPU backward runs on the calling thread).
StepPhase current_step_phase();

/// Sets the phase for its lifetime and restores the previous one; records a sample at both ends
/// when a timeline is recording.
class StepPhaseScope {
 public:
  explicit StepPhaseScope(StepPhase phase);
  ~StepPhaseScope();
  StepPhaseScope(const StepPhaseScope&) = delete;
  StepPhaseScope& operator=(const StepPhaseScope&) = delete;

 private:
  StepPhase previous_;
};

struct MemoryEvent {
  double seconds = 0;  ///< since the timeline started
  int64_t bytes = 0;   ///< held on the device after the event
  StepPhase phase = StepPhase::idle;
};

/// Records bytes held on `device` from construction until `stop()` (or destruction). One timeline
/// records at a time; CPU needs the tracker installed (install_cpu_memory_tracker()).
class MemoryTimeline {
 public:
  explicit MemoryTimeline(c10::Device device = c10::kCPU);
  ~MemoryTimeline();
  MemoryTimeline(const MemoryTimeline&) = delete;
  MemoryTimeline& operator=(const MemoryTimeline&) = delete;

  /// Stops recording and returns the events in order (a second call returns none).
  std::vector<MemoryEvent> stop();

 private:
  bool recording_ = false;
};

/// Writes events as CSV: `seconds,bytes,phase`, one line each, after a header.
void write_memory_events_csv(const std::vector<MemoryEvent>& events, const std::string& path);

}  // namespace remat
