// remat/memory/memory_timeline.h: every allocation and free with its bytes and step phase, and its CSV.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/checkpoint/checkpoint.h"
#include "remat/memory/memory.h"
#include "remat/memory/memory_timeline.h"

TEST(MemoryTimeline, RecordsEveryAllocationAndFreeWithItsBytes) {
  remat::install_cpu_memory_tracker();
  const int64_t base = remat::memory_stats().current_bytes;
  remat::MemoryTimeline timeline;
  {
    at::Tensor a = torch::empty({100}, torch::kFloat);
    at::Tensor b = torch::empty({50}, torch::kDouble);
  }
  const auto events = timeline.stop();
  ASSERT_EQ(events.size(), 5u);  // start, two allocations, two frees
  EXPECT_EQ(events[0].bytes, base);
  EXPECT_EQ(events[1].bytes, base + 400);
  EXPECT_EQ(events[2].bytes, base + 800);
  EXPECT_EQ(events[4].bytes, base);
  for (size_t i = 1; i < events.size(); ++i) EXPECT_GE(events[i].seconds, events[i - 1].seconds);
  EXPECT_TRUE(timeline.stop().empty());
}

TEST(MemoryTimeline, OneRecordsAtATime) {
  remat::install_cpu_memory_tracker();
  remat::MemoryTimeline first;
  try {
    remat::MemoryTimeline second;
    FAIL() << "a second timeline started";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("another timeline is recording"), std::string::npos) << e.what();
  }
}

TEST(MemoryTimeline, MarksForwardBackwardAndRecomputePhases) {
  remat::install_cpu_memory_tracker();
  at::Tensor w = torch::randn({64, 64}, torch::requires_grad());
  at::Tensor x = torch::randn({8, 64}, torch::requires_grad());
  auto layer = [&](const at::Tensor& in) { return in.matmul(w).tanh(); };
  remat::MemoryTimeline timeline;
  remat::measure_step([&] { return remat::checkpoint(layer, layer(x)).sum(); });
  const auto events = timeline.stop();
  EXPECT_EQ(remat::current_step_phase(), remat::StepPhase::idle);
  std::vector<remat::StepPhase> order;  // the phases in order, repeats collapsed
  int64_t recompute_growth = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    if (order.empty() || order.back() != events[i].phase) order.push_back(events[i].phase);
    if (i > 0 && events[i].phase == remat::StepPhase::recompute) {
      recompute_growth = std::max(recompute_growth, events[i].bytes - events[i - 1].bytes);
    }
  }
  using P = remat::StepPhase;
  const std::vector<P> expected = {P::idle, P::forward, P::idle, P::backward, P::recompute, P::backward, P::idle};
  EXPECT_EQ(order, expected);
  EXPECT_GE(recompute_growth, 8 * 64 * 4);  // the recompute allocates the layer's output again
}

TEST(MemoryTimeline, WritesCsvAndRejectsAnUnwritablePath) {
  const std::vector<remat::MemoryEvent> events = {{0.0, 10, remat::StepPhase::idle},
                                                  {0.5, 20, remat::StepPhase::recompute}};
  const std::string path = testing::TempDir() + "remat_timeline_test.csv";
  remat::write_memory_events_csv(events, path);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "seconds,bytes,phase\n0,10,idle\n0.5,20,recompute\n");
  EXPECT_THROW(remat::write_memory_events_csv(events, "/nonexistent-dir/t.csv"), c10::Error);
}
