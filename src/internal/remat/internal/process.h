// remat/internal/process.h — process-wide settings for remat's own programs (the CLI, benchmarks,
// examples): CPU threads without oversubscription, and freed memory kept in the process. Not
// installed: they change the whole process, which a library must leave to its user.
//
// Using N CPU cores for training without oversubscribing them:
//
// When LibTorch's BLAS is OpenBLAS with its own thread pool (Debian's build), LibTorch's intra-op
// pool and OpenBLAS's each start N threads; on N cores they preempt each other (measured here on 2
// cores: a training step of the reference workload took ~1.6 s that way and ~0.85 s with matmuls on OpenBLAS's 2
// threads and LibTorch's other ops on one). `set_cpu_threads(n)` gives the cores to OpenBLAS when
// it is present, and to LibTorch's pool otherwise.
#pragma once

#include <string>

namespace remat {

/// The CPUs this process may run on (its affinity mask; the online CPUs where that is unknown).
int usable_cpus();

/// Configures the process to compute on `threads` cores, 1 to usable_cpus() (more is an error:
/// never a hang); returns what it did, for reports.
std::string set_cpu_threads(int threads);

/// Keeps memory LibTorch frees inside the process instead of returning it to the kernel (glibc:
/// large blocks from the heap, not fresh mmaps; no trimming below 1 GiB). Otherwise every step of a
/// memory-hungry plan faults its activations in again page by page, which on few cores costs a large
/// part of the compute and makes step times depend on the peak rather than on the work (the unchecked
/// reference step measured ~30% slower for it). Call it first in programs that compare step times, as CPU
/// trainers do with jemalloc or tcmalloc. Exact tensor bytes (the tracker) are unaffected.
void keep_freed_memory_in_process();

}  // namespace remat
