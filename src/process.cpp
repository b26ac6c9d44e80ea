#include "remat/internal/process.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace remat {

void keep_freed_memory_in_process() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 1 << 30);  // serve blocks up to 1 GiB from the heap, not fresh mmaps
  mallopt(M_TRIM_THRESHOLD, 1 << 30);  // and keep up to 1 GiB of free heap top
#endif
}

}  // namespace remat
