#include "remat/memory/memory_timeline.h"

#include <atomic>
#include <chrono>
#include <iomanip>
#include <mutex>
#include <sstream>

#include "remat/internal/files.h"
#include "memory/cuda_memory.h"
#include "memory/timeline_recorder.h"
#include "remat/base/error.h"
#include "remat/memory/memory.h"

namespace remat {
namespace detail {

// Never destroyed, like the tracking allocator (memory.cpp): tensors (and a runtime's own
// timeline, through the C interface) may still be freed during static destruction at exit.
TimelineRecorder& timeline_recorder() {
  static auto* recorder = new TimelineRecorder;
  return *recorder;
}

}  // namespace detail

namespace {

using detail::timeline_recorder;

std::atomic<int> step_phase{static_cast<int>(StepPhase::idle)};

}  // namespace

const char* to_string(StepPhase phase) {
  switch (phase) {
    case StepPhase::idle:
      return "idle";
    case StepPhase::forward:
      return "forward";
    case StepPhase::backward:
      return "backward";
    case StepPhase::recompute:
      return "recompute";
  }
  return "unknown";
}

StepPhase current_step_phase() { return static_cast<StepPhase>(step_phase.load()); }

namespace {
void sample_at_phase_change() {
  auto& recorder = timeline_recorder();
  if (!recorder.active) return;
  c10::Device device = c10::kCPU;
  {
    std::lock_guard<std::mutex> lock(recorder.mutex);
    device = recorder.device;
  }
  detail::synchronize_if_cuda(device);
  recorder.record(memory_stats(device).current_bytes, device);
}
}  // namespace

StepPhaseScope::StepPhaseScope(StepPhase phase) : previous_(current_step_phase()) {
  sample_at_phase_change();  // the last moment of the previous phase
  step_phase.store(static_cast<int>(phase));
  sample_at_phase_change();
}

StepPhaseScope::~StepPhaseScope() {
  sample_at_phase_change();
  step_phase.store(static_cast<int>(previous_));
  sample_at_phase_change();
}

MemoryTimeline::MemoryTimeline(c10::Device device) {
  const MemoryStats now = memory_stats(device);  // checks the device and, on CPU, the tracker
  auto& recorder = timeline_recorder();
  std::lock_guard<std::mutex> lock(recorder.mutex);
  REMAT_CHECK(!recorder.active, "MemoryTimeline: another timeline is recording; stop it first (one at a time).");
  recorder.device = device;
  recorder.events.clear();
  recorder.start = std::chrono::steady_clock::now();
  recorder.events.push_back({0.0, now.current_bytes, current_step_phase()});
  recorder.active = true;
  recording_ = true;
}

MemoryTimeline::~MemoryTimeline() { stop(); }

std::vector<MemoryEvent> MemoryTimeline::stop() {
  if (!recording_) return {};
  recording_ = false;
  auto& recorder = timeline_recorder();
  std::lock_guard<std::mutex> lock(recorder.mutex);
  recorder.active = false;
  return std::move(recorder.events);
}

void write_memory_events_csv(const std::vector<MemoryEvent>& events, const std::string& path) {
  std::ostringstream text;
  text << "seconds,bytes,phase\n" << std::setprecision(9);
  for (const auto& e : events) text << e.seconds << ',' << e.bytes << ',' << to_string(e.phase) << '\n';
  write_file_atomically(path, text.str());
}

}  // namespace remat
