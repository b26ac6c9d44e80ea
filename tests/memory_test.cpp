// remat/memory/memory.h: exact byte accounting of the tracking CPU allocator, the step measurement, and freed
// memory kept in the process.
#include <thread>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/memory/memory.h"

TEST(MemoryTracker, CountsExactBytesOfLiveTensorsAndAResettablePeak) {
  remat::install_cpu_memory_tracker();
  remat::install_cpu_memory_tracker();  // idempotent
  EXPECT_TRUE(remat::cpu_memory_tracker_installed());
  const int64_t base = remat::memory_stats().current_bytes;
  remat::reset_peak_memory();
  {
    at::Tensor a = torch::empty({1000}, torch::kFloat);
    at::Tensor b = torch::empty({10, 10}, torch::kDouble);
    EXPECT_EQ(remat::memory_stats().current_bytes - base, 4000 + 800);
  }
  const auto stats = remat::memory_stats();
  EXPECT_EQ(stats.current_bytes, base);
  EXPECT_EQ(stats.peak_bytes - base, 4800);
  remat::reset_peak_memory();
  EXPECT_EQ(remat::memory_stats().peak_bytes, base);
}

TEST(MemoryTracker, IsThreadSafe) {
  remat::install_cpu_memory_tracker();
  const int64_t base = remat::memory_stats().current_bytes;
  auto churn = [] {
    for (int i = 0; i < 2000; ++i) {
      at::Tensor t = torch::empty({64 + i % 7}, torch::kFloat);
    }
  };
  std::thread t1(churn), t2(churn);
  t1.join();
  t2.join();
  EXPECT_EQ(remat::memory_stats().current_bytes, base);
}

TEST(MemoryTracker, ViewsAndInPlaceOpsAllocateNothing) {
  remat::install_cpu_memory_tracker();
  at::Tensor a = torch::ones({256});
  const int64_t base = remat::memory_stats().current_bytes;
  at::Tensor v = a.view({16, 16}).transpose(0, 1);
  a.mul_(2);
  EXPECT_EQ(remat::memory_stats().current_bytes, base);
}

TEST(MeasureStep, ReportsBytesBeforeAtEndOfForwardAndPeak) {
  remat::install_cpu_memory_tracker();
  at::Tensor w = torch::randn({128, 128}, torch::requires_grad());
  at::Tensor x = torch::randn({64, 128});
  const auto m = remat::measure_step([&] { return x.mm(w).exp().sum(); });
  // Kept by the graph: exp's output (64x128 floats, saved by ExpBackward); mm's output is freed
  // after exp consumed it; plus the scalar loss.
  EXPECT_EQ(m.activation_bytes_at_end_of_forward(), 64 * 128 * 4 + 4);
  EXPECT_GE(m.activation_peak_bytes(), m.activation_bytes_at_end_of_forward() + 128 * 128 * 4);  // + w.grad
  EXPECT_GT(m.step_seconds, 0.0);
  EXPECT_GE(m.step_seconds, m.forward_seconds);
}

TEST(MeasureStep, RejectsAForwardThatReturnsNoLoss) {
  remat::install_cpu_memory_tracker();
  try {
    remat::measure_step([] { return torch::ones({2}); });
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("scalar loss that requires grad"), std::string::npos);
  }
}

TEST(MemoryStats, UnsupportedDeviceIsAClearError) {
  try {
    remat::memory_stats(c10::Device(c10::kMeta));
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("is not supported"), std::string::npos);
  }
}

#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 33)
// The trim threshold alone would fix glibc's mmap threshold at 128 KiB: every activation above it
// a fresh mapping, faulted in again each step (8-11x slower steps where faults are costly).
TEST(KeepFreedMemoryInProcess, TensorsUpTo32MiBComeFromTheHeapAndStayThere) {
  remat::keep_freed_memory_in_process();
  const size_t mapped_before = mallinfo2().hblks;
  size_t heap_holding_it = 0;
  {
    at::Tensor activation = at::ones({4 << 20}, at::kFloat);  // 16 MiB
    EXPECT_EQ(mallinfo2().hblks, mapped_before) << "a 16 MiB tensor was mmapped";
    EXPECT_EQ(activation.sum().item<float>(), static_cast<float>(4 << 20));
    heap_holding_it = mallinfo2().arena;
  }
  // Freed, it stays in the process: the heap was not trimmed.
  EXPECT_EQ(mallinfo2().arena, heap_holding_it);
}
#endif
