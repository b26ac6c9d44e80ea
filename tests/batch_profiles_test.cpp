// remat/measure/batch_profiles.h: profiles at several batch sizes, put on one clock, and the frontier measured.
#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/chain/sequential_chain.h"
#include "remat/measure/batch_profiles.h"
#include "remat/measure/plan_measurement.h"
#include "remat/measure/profiler.h"
#include "remat/memory/memory.h"
#include "remat/planning/cost_model.h"
#include "remat/planning/throughput.h"
#include "support/models.h"

namespace nn = torch::nn;
namespace F = torch::nn::functional;

// The throughput search on a model of one's own: a SequentialChain, its sample made from the batch
// size, profiled at three sizes; the chosen micro-batch's plan measures within the budget.
TEST(Throughput, WorksForASequentialChainGivenASampleOfEachBatchSize) {
  remat::install_cpu_memory_tracker();
  torch::manual_seed(0);
  nn::Sequential net = remat::testing::linear_gelu_stack(6, 32, 128);
  const at::Tensor inputs = torch::randn({16, 32}), targets = torch::randn({16, 32});
  // The loss takes the targets of whatever batch the output has.
  remat::SequentialChain chain(
      net, [&](const at::Tensor& out) { return F::mse_loss(out, targets.narrow(0, 0, out.size(0))); });
  const auto sample = [&](int64_t batch) { return inputs.narrow(0, 0, batch); };
  const remat::ProfiledBatches profiled =
      remat::profile_batches(chain, sample, remat::default_profile_batches(16), remat::ProfileOptions().repeats(1));
  ASSERT_EQ(profiled.tables.size(), 3u);  // 16, 4 and 1
  ASSERT_EQ(profiled.time_scales.size(), 3u);
  {
    // A profile taken while the machine ran ten times slower is put back on the others' clock: each
    // table is scaled by one factor, its measured unchecked step over its predicted one, every time
    // and no byte. (The factors themselves are timed, so on a loaded machine they are not asserted.)
    remat::ProfiledBatches skewed = profiled;
    remat::CostTable& slow = skewed.tables[1].second;
    for (auto& stage : slow.stages) {
      stage.nograd_seconds *= 10;
      for (auto& o : stage.options) {
        o.forward_seconds *= 10;
        o.backward_seconds *= 10;
        if (o.graph_only) o.graph_only->forward_seconds *= 10, o.graph_only->backward_seconds *= 10;
      }
    }
    const remat::CostTable slow_before = slow;
    const auto step_of = [](const remat::CostTable& t) { return remat::simulate(t.unchecked_plan(), t).step_seconds; };
    EXPECT_NEAR(step_of(slow_before) / step_of(profiled.tables[1].second), 10.0, 1e-9);
    remat::align_step_times(chain, sample, skewed, remat::ProfileOptions().repeats(3));
    for (size_t i = 0; i < skewed.tables.size(); ++i) {
      SCOPED_TRACE(skewed.tables[i].first);
      const double scale = skewed.time_scales[i];
      ASSERT_TRUE(std::isfinite(scale) && scale > 0);
      const remat::CostTable& before = i == 1 ? slow_before : profiled.tables[i].second;
      const remat::CostTable& after = skewed.tables[i].second;
      ASSERT_EQ(after.stages.size(), before.stages.size());
      for (size_t s = 0; s < after.stages.size(); ++s) {
        EXPECT_NEAR(after.stages[s].nograd_seconds, scale * before.stages[s].nograd_seconds,
                    1e-9 * before.stages[s].nograd_seconds + 1e-15);
        ASSERT_EQ(after.stages[s].options.size(), before.stages[s].options.size());
        for (size_t o = 0; o < after.stages[s].options.size(); ++o) {
          const auto& a = after.stages[s].options[o];
          const auto& b = before.stages[s].options[o];
          EXPECT_NEAR(a.forward_seconds, scale * b.forward_seconds, 1e-9 * b.forward_seconds + 1e-15);
          EXPECT_NEAR(a.backward_seconds, scale * b.backward_seconds, 1e-9 * b.backward_seconds + 1e-15);
          EXPECT_EQ(a.kept_bytes, b.kept_bytes) << "bytes are not times: never scaled";
        }
      }
    }
  }
  const remat::ThroughputChoice choice = remat::plan_throughput(profiled.costs_at(), 16, "40%");
  ASSERT_EQ(choice.frontier.size(), 5u);  // 1, 2, 4, 8, 16
  const remat::MicroBatchChoice& best = choice.chosen();
  EXPECT_EQ(best.micro_batch * best.accumulation, 16);
  for (const auto& f : choice.frontier) {
    EXPECT_EQ(f.micro_batch * f.accumulation, 16);
    if (f.planned.feasible) EXPECT_GE(best.predicted_samples_per_second, f.predicted_samples_per_second);
  }
  // Run: each micro-batch's plan within the budget (the interpolated tables included).
  const auto measured = remat::measure_frontier(choice, [&](const std::vector<remat::MicroBatchRun>& runs) {
    std::vector<remat::PlanRun> on_chain;
    for (const auto& r : runs) on_chain.push_back({&chain, r.plan, sample(r.micro_batch)});
    return remat::measure_runs(on_chain, 1);
  });
  ASSERT_FALSE(measured.empty());
  for (const auto& m : measured) {
    EXPECT_LE(m.planned.activation_peak_bytes, choice.budget_bytes) << "micro-batch " << m.micro_batch;
    EXPECT_GT(m.samples_per_second, 0);
  }
}
