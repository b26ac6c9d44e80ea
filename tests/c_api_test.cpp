// The C interface of the memory tracker, used the way another runtime uses it: a process that
// loads LibTorch, then libremat_memory_tracker.so with dlopen, and counts exact bytes through it.
// (Linked against LibTorch only, not remat.)
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <string>

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
  // The timeline: start, one allocation and its free under a forward phase, saved as CSV.
  auto timeline_start = reinterpret_cast<int (*)()>(dlsym(library, "remat_timeline_start"));
  auto timeline_save = reinterpret_cast<int64_t (*)(const char*)>(dlsym(library, "remat_timeline_stop_and_save"));
  auto push_phase = reinterpret_cast<int (*)(int)>(dlsym(library, "remat_push_step_phase"));
  auto pop_phase = reinterpret_cast<int (*)()>(dlsym(library, "remat_pop_step_phase"));
  if (!timeline_start || !timeline_save || !push_phase || !pop_phase) {
    std::fprintf(stderr, "missing timeline symbols\n");
    return 1;
  }
  const char* path = "c_api_test_timeline.csv";
  if (timeline_save(path) != -1 || push_phase(7) != -1) {
    std::fprintf(stderr, "expected errors for saving an unstarted timeline and for an unknown phase\n");
    ++failures;
  }
  if (timeline_start() != 0 || push_phase(1) != 0) return 1;
  if (timeline_save(nullptr) != -1) {
    std::fprintf(stderr, "expected an error for saving to no file\n");
    ++failures;
  }
  { at::Tensor c = at::empty({25}, at::kFloat); }
  pop_phase();
  // start, phase entry (2 samples), allocation, free, phase exit (2 samples)
  const int64_t events = timeline_save(path);
  if (events != 7) {
    std::fprintf(stderr, "expected 7 timeline events, got %lld\n", static_cast<long long>(events));
    ++failures;
  }
  if (FILE* csv = std::fopen(path, "r")) {
    char header[64] = {0}, line[64] = {0};
    std::fgets(header, sizeof header, csv);
    long long before_bytes = -1, allocated_bytes = -1;
    for (int i = 0; i < 4; ++i) {  // rows 1-3: start and the phase entry; row 4: the allocation
      std::fgets(line, sizeof line, csv);
      double seconds = 0;
      long long bytes = 0;
      if (std::sscanf(line, "%lf,%lld", &seconds, &bytes) == 2) (i < 3 ? before_bytes : allocated_bytes) = bytes;
    }
    std::fclose(csv);
    if (std::string(header) != "seconds,bytes,phase\n" || std::string(line).find(",forward") == std::string::npos ||
        allocated_bytes - before_bytes != 100) {
      std::fprintf(stderr, "unexpected CSV: '%s' then '%s' (%lld bytes more, expected 100)\n", header, line,
                   allocated_bytes - before_bytes);
      ++failures;
    }
  } else {
    std::fprintf(stderr, "no CSV written\n");
    ++failures;
  }
  std::printf("%d passed, %d failed\n", failures == 0 ? 1 : 0, failures);
  return failures == 0 ? 0 : 1;
}
