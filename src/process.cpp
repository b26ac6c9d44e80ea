#include "remat/cpu_threads.h"

#include <dlfcn.h>

#include <ATen/Parallel.h>

#include "remat/error.h"

namespace remat {

std::string set_cpu_threads(int threads) {
  REMAT_CHECK(threads >= 1, "the number of CPU threads must be at least 1, got ", threads, ".");
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

}  // namespace remat
