// The C interface of the memory tracker, used the way another runtime uses it: a process that
// loads LibTorch, then libremat_memory_tracker.so with dlopen, and counts exact bytes through it.
// (Linked against LibTorch only, not remat.)
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>

#include <ATen/ops/empty.h>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s path/to/libremat_memory_tracker.so\n", argv[0]);
    return 2;
  }
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    std::fprintf(stderr, "dlopen failed: %s\n", dlerror());
    return 1;
  }
  auto install = reinterpret_cast<void (*)()>(dlsym(library, "remat_install_cpu_memory_tracker"));
  auto current = reinterpret_cast<int64_t (*)()>(dlsym(library, "remat_cpu_current_bytes"));
  auto peak = reinterpret_cast<int64_t (*)()>(dlsym(library, "remat_cpu_peak_bytes"));
  auto reset = reinterpret_cast<void (*)()>(dlsym(library, "remat_cpu_reset_peak"));
  if (!install || !current || !peak || !reset) {
    std::fprintf(stderr, "missing symbols\n");
    return 1;
  }
  install();
  const int64_t base = current();
  reset();
  int failures = 0;
  {
    at::Tensor a = at::empty({1000}, at::kFloat);
    at::Tensor b = at::empty({10}, at::kDouble);
    if (current() - base != 4080) {
      std::fprintf(stderr, "expected 4080 bytes held, got %lld\n", static_cast<long long>(current() - base));
      ++failures;
    }
  }
  if (current() != base || peak() - base != 4080) {
    std::fprintf(stderr, "expected everything freed and a peak of 4080, got %lld and %lld\n",
                 static_cast<long long>(current() - base), static_cast<long long>(peak() - base));
    ++failures;
  }
  std::printf("%d passed, %d failed\n", failures == 0 ? 1 : 0, failures);
  return failures == 0 ? 0 : 1;
}
