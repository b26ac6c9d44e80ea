// remat/internal/process.h — a process-wide setting for remat's own programs (the CLI, benchmarks):
// freed memory kept in the process. Not installed: it changes the whole process, which a
// library must leave to its user. (CPU threads: remat/threads.h, public.)
#pragma once

#include "remat/threads.h"

namespace remat {

/// Keeps memory LibTorch frees inside the process instead of returning it to the kernel (glibc:
/// large blocks from the heap, not fresh mmaps; no trimming below 1 GiB). Otherwise every step of a
/// memory-hungry plan faults its activations in again page by page, which on few cores costs a large
/// part of the compute and makes step times depend on the peak rather than on the work (the unchecked
/// reference step measured ~30% slower for it). Call it first in programs that compare step times, as CPU
/// trainers do with jemalloc or tcmalloc. Exact tensor bytes (the tracker) are unaffected.
void keep_freed_memory_in_process();

}  // namespace remat
