// Keeps memory LibTorch frees inside the process instead of returning it to the kernel.
//
// LibTorch's CPU allocator is malloc. glibc serves large blocks with mmap and trims the heap's top,
// so every training step of a memory-hungry plan faults its activations in again page by page:
// on two cores that costs as much as a large part of the compute and makes step times depend on
// the peak rather than on the work (the unchecked plan measured ~30% slower for it here). Timings
// in remat's programs are meant to compare recompute, so they keep freed memory, as CPU trainers
// do with jemalloc or tcmalloc. Exact tensor bytes (the tracking allocator) are unaffected.
#pragma once

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace remat::cli {

inline void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 1 << 30);   // serve blocks up to 1 GiB from the heap, not fresh mmaps
  mallopt(M_TRIM_THRESHOLD, 1 << 30);   // and keep up to 1 GiB of free heap top
#endif
}

}  // namespace remat::cli
