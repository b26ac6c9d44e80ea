// Exact byte accounting of the tracking CPU allocator and the step measurement.
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/memory.h"

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
