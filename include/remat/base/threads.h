// remat/base/threads.h — the process's CPU threads: how they are arranged, and the arrangement remat times under.
//
//   at::set_num_threads(2);                        // as LibTorch documents it
//   std::cout << remat::cpu_threads() << "\n";     // 2 LibTorch intra-op + 2 OpenBLAS threads on 2 CPUs (oversubscribed)
//   remat::set_cpu_threads(2);                     // 1 LibTorch intra-op + 2 OpenBLAS threads: steps ~2x faster here
//
// Where LibTorch's BLAS is OpenBLAS with a pool of its own (Debian's build), at::set_num_threads sizes
// LibTorch's intra-op pool only; OpenBLAS's keeps one thread per CPU. With both pools above one
// thread and more threads than CPUs, they preempt each other: steps run slower and their times
// scatter (docs/library.md, "Threads"). The profiler and measure_plans therefore time under
// set_cpu_threads' arrangement when they find the caller's oversubscribed, put the caller's back
// afterwards, and say so (CostTable::threads, PlanMeasurement::threads); ThreadsWhileTiming::as_found
// times the arrangement as it is.
#pragma once

#include <ostream>
#include <string>

namespace remat {

struct CpuThreads {
  int cpus = 1;      ///< the CPUs this process may run on (its affinity mask)
  int intra_op = 1;  ///< LibTorch's intra-op threads (at::get_num_threads)
  int blas = 0;      ///< OpenBLAS's threads; 0 where LibTorch's BLAS has no pool of its own
  /// Both pools above one thread, and more threads than CPUs between them.
  bool oversubscribed() const;
  /// "1 LibTorch intra-op + 2 OpenBLAS threads on 2 CPUs", with " (oversubscribed)" where it is.
  std::string to_string() const;
  bool operator==(const CpuThreads& other) const;
  bool operator!=(const CpuThreads& other) const { return !(*this == other); }
};
std::ostream& operator<<(std::ostream& stream, const CpuThreads& threads);

/// The CPUs this process may run on (its affinity mask; the online CPUs where that is unknown).
int usable_cpus();
/// The arrangement now.
CpuThreads cpu_threads();
/// Computes on `threads` cores (1 to usable_cpus(); more is an error, never a hang) without
/// oversubscribing them: matmuls on OpenBLAS's `threads` and LibTorch's other work on one thread
/// where OpenBLAS has its pool, LibTorch's `threads` otherwise. Returns the new arrangement.
CpuThreads set_cpu_threads(int threads);
/// Sets both pools as `threads` has them (an arrangement cpu_threads() returned): puts one back.
/// Each pool is bounded as set_cpu_threads bounds its count (check_cpu_threads): intra_op from 1 to
/// usable_cpus(), blas 0 (no pool) or likewise; more is an error, never a hang.
void restore_cpu_threads(const CpuThreads& threads);
/// The one bound on a count of CPU threads, for every path that sets one (set_cpu_threads,
/// restore_cpu_threads, a program's --threads): throws a clear error, naming `what`, unless
/// 1 <= threads <= usable_cpus().
void check_cpu_threads(int threads, const std::string& what);

/// Warns once per process, on standard error, when the arrangement is oversubscribed, naming the
/// fix (set_cpu_threads). The first checkpoint, profile and plan call it; after the check it costs
/// one at::get_num_threads() per call, and nothing after the warning. LibTorch's defaults on a
/// machine with OpenBLAS are oversubscribed (both pools one thread per CPU). Silenced by
/// set_thread_warning(false) or the environment variable REMAT_THREAD_WARNING=0.
void warn_if_threads_oversubscribed();
/// Turns that warning on or off for the process (on by default).
void set_thread_warning(bool enabled);
/// The warning's text for `threads` (empty where they are not oversubscribed).
std::string oversubscription_warning(const CpuThreads& threads);

/// How the profiler and measure_plans treat the caller's threads while they time.
enum class ThreadsWhileTiming {
  arranged,  ///< an oversubscribed arrangement is replaced by set_cpu_threads' while timing
  as_found,  ///< timed as they are (what a program that keeps them oversubscribed would see)
};

/// While alive, the arrangement to time under (see ThreadsWhileTiming); the caller's is put back
/// when it ends.
class TimingThreads {
 public:
  explicit TimingThreads(ThreadsWhileTiming policy = ThreadsWhileTiming::arranged);
  ~TimingThreads();
  TimingThreads(const TimingThreads&) = delete;
  TimingThreads& operator=(const TimingThreads&) = delete;

  const CpuThreads& found() const { return found_; }
  const CpuThreads& timed() const { return timed_; }
  bool switched() const { return found_ != timed_; }
  /// What was timed under, and, where it was switched, what the caller had and what to call.
  std::string description() const;

 private:
  CpuThreads found_, timed_;
};

}  // namespace remat
