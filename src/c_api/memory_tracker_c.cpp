// A C interface to remat's CPU memory tracker, built as a shared library (libremat_memory_tracker.so)
// so other runtimes that load the same LibTorch — Python's torch, through ctypes — can count exact
// bytes the same way remat does:
//
//   import torch, ctypes
//   tracker = ctypes.CDLL("build/libremat_memory_tracker.so")
//   tracker.remat_install_cpu_memory_tracker()
//   tracker.remat_cpu_current_bytes.restype = ctypes.c_int64
#include <cstdint>

#include "remat/memory.h"

extern "C" {

__attribute__((visibility("default"))) void remat_install_cpu_memory_tracker() { remat::install_cpu_memory_tracker(); }

__attribute__((visibility("default"))) int64_t remat_cpu_current_bytes() {
  return remat::memory_stats(c10::kCPU).current_bytes;
}

__attribute__((visibility("default"))) int64_t remat_cpu_peak_bytes() { return remat::memory_stats(c10::kCPU).peak_bytes; }

__attribute__((visibility("default"))) void remat_cpu_reset_peak() { remat::reset_peak_memory(c10::kCPU); }

}  // extern "C"
