#include "remat/base/threads.h"

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <string>

#include <ATen/Parallel.h>

#include "remat/base/error.h"

namespace remat {
namespace {

// Looked up at run time: remat does not link OpenBLAS itself, LibTorch may.
using SetThreads = void (*)(int);
using GetThreads = int (*)();

SetThreads openblas_setter() {
  static const auto setter = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  return setter;
}

GetThreads openblas_getter() {
  static const auto getter = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return getter;
}

std::string plural(int count, const char* word) { return std::to_string(count) + " " + word + (count == 1 ? "" : "s"); }

// Sets both pools, unchecked: for check_cpu_threads' callers and for putting back what the process
// itself had.
void apply_cpu_threads(const CpuThreads& threads) {
  if (threads.blas > 0 && openblas_setter() != nullptr) openblas_setter()(threads.blas);
  at::set_num_threads(threads.intra_op);
}

}  // namespace

void check_cpu_threads(int threads, const std::string& what) {
  REMAT_CHECK(threads >= 1, what, " must be at least 1, got ", threads, ".");
  // More threads than cores only preempt each other; thousands can also exhaust a limited address
  // space, where OpenBLAS's pool waits forever for threads it could not start.
  const int cpus = usable_cpus();
  REMAT_CHECK(threads <= cpus, what, ": ", threads, " CPU threads asked for, but this process may run on ",
              plural(cpus, "CPU"), "; give 1 to ", cpus, ".");
}

bool CpuThreads::oversubscribed() const { return intra_op > 1 && blas > 1 && intra_op + blas > cpus; }

std::string CpuThreads::to_string() const {
  std::string text = std::to_string(intra_op) + " LibTorch intra-op";
  if (blas > 0) text += " + " + std::to_string(blas) + " OpenBLAS";
  text += (intra_op + blas == 1 ? " thread on " : " threads on ") + plural(cpus, "CPU");
  return text + (oversubscribed() ? " (oversubscribed)" : "");
}

bool CpuThreads::operator==(const CpuThreads& other) const {
  return cpus == other.cpus && intra_op == other.intra_op && blas == other.blas;
}

std::ostream& operator<<(std::ostream& stream, const CpuThreads& threads) { return stream << threads.to_string(); }

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

CpuThreads cpu_threads() {
  CpuThreads threads;
  threads.cpus = usable_cpus();
  threads.intra_op = at::get_num_threads();
  threads.blas = openblas_setter() != nullptr && openblas_getter() != nullptr ? std::max(1, openblas_getter()()) : 0;
  return threads;
}

CpuThreads set_cpu_threads(int threads) {
  check_cpu_threads(threads, "the number of CPU threads");
  if (openblas_setter() != nullptr) {
    openblas_setter()(threads);
    at::set_num_threads(1);
  } else {
    at::set_num_threads(threads);
  }
  return cpu_threads();
}

void restore_cpu_threads(const CpuThreads& threads) {
  // Both pools bounded as set_cpu_threads bounds its count: 64 or 100,000 threads would otherwise
  // hang OpenBLAS under a process limit. A BLAS pool of 0 means none (LibTorch's BLAS has no pool).
  check_cpu_threads(threads.intra_op, "restore_cpu_threads: the LibTorch intra-op threads (CpuThreads::intra_op)");
  REMAT_CHECK(threads.blas >= 0, "restore_cpu_threads: the OpenBLAS threads (CpuThreads::blas) must be 0 (no pool) ",
              "or from 1 to the CPUs, got ", threads.blas, ".");
  if (threads.blas > 0) check_cpu_threads(threads.blas, "restore_cpu_threads: the OpenBLAS threads (CpuThreads::blas)");
  apply_cpu_threads(threads);
}

namespace {
std::atomic<bool> thread_warning_done{false};  // warned, or silenced
std::atomic<int> intra_op_checked{-1};         // at::get_num_threads() when last found not oversubscribed
std::mutex thread_warning_mutex;
}  // namespace

std::string oversubscription_warning(const CpuThreads& threads) {
  if (!threads.oversubscribed()) return {};
  const int fix = std::min(std::max(threads.intra_op, threads.blas), threads.cpus);
  return "remat: warning: " + threads.to_string() + ": LibTorch's and OpenBLAS's thread pools preempt each " +
         "other, so steps run up to several times slower and their times scatter. Call remat::set_cpu_threads(" +
         std::to_string(fix) + ") instead of at::set_num_threads (" + std::to_string(fix) +
         " OpenBLAS threads for matrix products, one LibTorch intra-op thread); see remat/base/threads.h. " +
         "Shown once; REMAT_THREAD_WARNING=0 or remat::set_thread_warning(false) silences it.\n";
}

void set_thread_warning(bool enabled) { thread_warning_done = !enabled; }

void warn_if_threads_oversubscribed() {
  if (thread_warning_done.load(std::memory_order_relaxed)) return;
  const int intra_op = at::get_num_threads();
  if (intra_op == intra_op_checked.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(thread_warning_mutex);
  if (thread_warning_done) return;
  const char* setting = std::getenv("REMAT_THREAD_WARNING");
  if (setting != nullptr && std::string(setting) == "0") {
    thread_warning_done = true;
    return;
  }
  const std::string warning = oversubscription_warning(cpu_threads());
  if (warning.empty()) {
    intra_op_checked = intra_op;
    return;
  }
  thread_warning_done = true;
  std::cerr << warning << std::flush;
}

TimingThreads::TimingThreads(ThreadsWhileTiming policy) : found_(cpu_threads()), timed_(found_) {
  if (policy == ThreadsWhileTiming::arranged && found_.oversubscribed()) {
    timed_ = set_cpu_threads(std::min(std::max(found_.intra_op, found_.blas), found_.cpus));
  }
}

TimingThreads::~TimingThreads() {
  if (!switched()) return;
  // The process's own arrangement, put back as it was found, whatever its size (OMP_NUM_THREADS
  // may have set more threads than CPUs): it was running before remat switched it.
  apply_cpu_threads(found_);
}

std::string TimingThreads::description() const {
  if (!switched()) return timed_.to_string();
  return timed_.to_string() + "; the caller's " + found_.to_string() +
         " was put back after timing (remat::set_cpu_threads(" +
         std::to_string(timed_.blas > 0 ? timed_.blas : timed_.intra_op) + ") trains as timed)";
}

}  // namespace remat
