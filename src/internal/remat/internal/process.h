// remat/cpu_threads.h — using N CPU cores for training without oversubscribing them.
//
// When LibTorch's BLAS is OpenBLAS with its own thread pool (Debian's build), LibTorch's intra-op
// pool and OpenBLAS's each start N threads; on N cores they preempt each other (measured here on 2
// cores: a training step of the reference workload took ~1.6 s that way and ~0.85 s with matmuls on OpenBLAS's 2
// threads and LibTorch's other ops on one). `set_cpu_threads(n)` gives the cores to OpenBLAS when
// it is present, and to LibTorch's pool otherwise.
#pragma once

#include <string>

namespace remat {

/// Configures the process to compute on `threads` cores; returns what it did, for reports.
std::string set_cpu_threads(int threads);

}  // namespace remat
