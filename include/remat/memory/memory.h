// remat/memory/memory.h — exact bytes held by tensors, and the cost of one training step.
//
//   remat::install_cpu_memory_tracker();                  // before allocating what you measure
//   auto m = remat::measure_step([&] { return model->forward(x).sum(); });
//   std::cout << m.activation_peak_bytes() << "\n";
//
// On CPU a tracking allocator (installed as LibTorch's CPU allocator) counts the bytes of every
// live tensor allocation made after it is installed; scratch memory of oneDNN/OpenBLAS bypasses
// it, activations do not. On CUDA the caching allocator's "allocated bytes" statistics are used
// (reserved-but-free cache memory is not counted).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace remat {

/// Bytes held by live tensor allocations on one device, and the most held since the last reset.
struct MemoryStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
};

/// Makes the tracking allocator LibTorch's CPU allocator. Idempotent and thread-safe; tensors
/// allocated before the call are not counted (their frees are not either).
void install_cpu_memory_tracker();
bool cpu_memory_tracker_installed();

/// Current and peak bytes on `device`. CPU needs the tracker installed; CUDA needs a CUDA build.
MemoryStats memory_stats(c10::Device device = c10::kCPU);
/// Sets the peak of `device` to its current bytes.
void reset_peak_memory(c10::Device device = c10::kCPU);
/// Raises the peak of `device` to at least `bytes` (CPU; a no-op on CUDA): for code that resets the
/// peak to measure parts of a step, so that a caller measuring around the step sees its whole peak.
void raise_peak_memory(int64_t bytes, c10::Device device = c10::kCPU);
/// Waits for the work queued on `device` (a CUDA device's stream); on the CPU, returns at once.
/// Before reading a clock or the counters above around work on a GPU.
void synchronize_device(c10::Device device);

/// What one training step cost. "Activation" figures are relative to what was held before the
/// forward (parameters, optimizer state, the batch).
struct StepMeasurement {
  int64_t bytes_before_forward = 0;
  int64_t bytes_at_end_of_forward = 0;  ///< the loss computed, nothing freed by backward yet
  int64_t peak_bytes = 0;               ///< during forward and backward
  double forward_seconds = 0;
  double step_seconds = 0;  ///< forward + backward

  int64_t activation_bytes_at_end_of_forward() const { return bytes_at_end_of_forward - bytes_before_forward; }
  int64_t activation_peak_bytes() const { return peak_bytes - bytes_before_forward; }
};

/// Keeps memory LibTorch frees on the CPU inside the process instead of returning it to the kernel
/// (glibc: blocks up to 32 MiB come from the heap, and no trimming below 1 GiB of free heap top),
/// so a step reuses last step's pages instead of faulting its activations in again. Measured with
/// the equivalent GLIBC_TUNABLES (docs/library.md, "Memory the process keeps"): the mixer example's
/// plain step 39 ms with glibc's defaults, 22 ms with this; a conv net and a Transformer as
/// fast as with glibc's defaults, where the trim threshold alone (this function before) made them
/// 8-11x slower on a machine with costly page faults. Call it first in a CPU training program, as
/// CPU trainers do with jemalloc or tcmalloc: it changes the whole process's allocator, which remat
/// never does by itself. Exact tensor bytes (the tracker) are unaffected; a no-op outside glibc.
void keep_freed_memory_in_process();

/// Bytes as MiB (2^20 bytes), the unit of remat's reports and plots.
inline double mebibytes(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

/// "12.3 MiB": bytes in MiB with one decimal, as remat's reports print them (the one formatter).
std::string format_bytes(int64_t bytes);

/// This machine's physical memory in bytes (0 where the system does not say).
double physical_memory_bytes();

/// Refuses, before anything is allocated, work that needs `bytes` (a double, so absurd sizes do not
/// overflow) when that passes 90% of this machine's physical memory: the error says what needs it
/// (`what`, e.g. "this configuration"), how much, what the machine has, and `how_to_fix`.
void check_fits_in_machine_memory(double bytes, const std::string& what, const std::string& how_to_fix);

/// Runs `forward` (returning a scalar loss), then backward on the loss, measuring memory on
/// `device` and wall time (synchronising CUDA before reading the clock).
StepMeasurement measure_step(const std::function<at::Tensor()>& forward, c10::Device device = c10::kCPU);

}  // namespace remat
