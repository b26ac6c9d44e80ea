#include "remat/internal/process.h"

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <ATen/Parallel.h>

#include "remat/error.h"

namespace remat {

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

std::string set_cpu_threads(int threads) {
  REMAT_CHECK(threads >= 1, "the number of CPU threads must be at least 1, got ", threads, ".");
  // More threads than cores only preempt each other; thousands can also exhaust a limited address
  // space, where OpenBLAS's pool waits forever for threads it could not start.
  const int cpus = usable_cpus();
  REMAT_CHECK(threads <= cpus, threads, " CPU threads asked for, but this process may run on ", cpus, " CPU",
              cpus == 1 ? "" : "s", "; give 1 to ", cpus, ".");
  using SetThreads = void (*)(int);
  // Looked up at run time: remat does not link OpenBLAS itself, LibTorch may.
  auto* openblas = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (openblas != nullptr) {
    openblas(threads);
    at::set_num_threads(1);
    return std::to_string(threads) + " OpenBLAS threads, 1 LibTorch intra-op thread";
  }
  at::set_num_threads(threads);
  return std::to_string(threads) + " LibTorch intra-op threads";
}

void keep_freed_memory_in_process() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 1 << 30);  // serve blocks up to 1 GiB from the heap, not fresh mmaps
  mallopt(M_TRIM_THRESHOLD, 1 << 30);  // and keep up to 1 GiB of free heap top
#endif
}

}  // namespace remat
