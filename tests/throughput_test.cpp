// remat/planning/throughput.h: the micro-batch search against brute force, the batch sizes profiled, and the
// interpolation of cost tables between them.
#include <cstdint>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/planning/planner.h"
#include "remat/planning/throughput.h"
#include "support/compare.h"
#include "support/cost_tables.h"

using remat::CostTable;
using remat::Plan;
using remat::testing::all_item_lists;
using remat::testing::random_chain;
using remat::testing::template_for;

namespace {

// A chain whose every byte figure grows linearly with the batch and every time affinely, as a
// profile's do: `base` at batch 1, `slope` more per sample.
CostTable simulated_table_at(const CostTable& base, const CostTable& slope, int64_t batch) {
  CostTable t = base;
  const auto b = static_cast<double>(batch - 1);
  auto grow = [b](int64_t& bytes, int64_t extra) { bytes += static_cast<int64_t>(b) * extra; };
  for (size_t i = 0; i < t.stages.size(); ++i) {
    remat::StageCost& s = t.stages[i];
    const remat::StageCost& d = slope.stages[i];
    grow(s.output_bytes, d.output_bytes);
    grow(s.input_grad_bytes, d.input_grad_bytes);
    grow(s.nograd_extra_bytes, d.nograd_extra_bytes);
    s.nograd_seconds += b * d.nograd_seconds;
    for (size_t o = 0; o < s.options.size(); ++o) {
      grow(s.options[o].kept_bytes, d.options[o].kept_bytes);
      grow(s.options[o].forward_extra_bytes, d.options[o].forward_extra_bytes);
      grow(s.options[o].backward_extra_bytes, d.options[o].backward_extra_bytes);
      s.options[o].forward_seconds += b * d.options[o].forward_seconds;
      s.options[o].backward_seconds += b * d.options[o].backward_seconds;
      s.options[o].graph_only.reset();
    }
  }
  return t;
}

}  // namespace

// The throughput search against brute force: every divisor micro-batch × every nested plan and
// option, simulated; the most samples per second among those that fit the budget.
TEST(Throughput, TheSearchEqualsBruteForceOverMicroBatchesAndPlans) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 6; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const CostTable base = random_chain(rng, 5, 2), slope = random_chain(rng, 5, 2);
    CostTable aligned_slope = base;  // the slope table must have base's options, stage for stage
    for (size_t i = 0; i < aligned_slope.stages.size(); ++i) {
      remat::StageCost& s = aligned_slope.stages[i];
      const remat::StageCost& r = slope.stages[i];
      s.output_bytes = r.output_bytes;
      s.input_grad_bytes = i == 0 ? 0 : slope.stages[i - 1].output_bytes;
      s.nograd_extra_bytes = r.nograd_extra_bytes;
      s.nograd_seconds = r.nograd_seconds;
      for (auto& o : s.options) {
        const auto& ro = r.options.front();
        o.kept_bytes = r.output_bytes + (ro.kept_bytes - r.output_bytes);
        o.forward_extra_bytes = ro.forward_extra_bytes;
        o.backward_extra_bytes = ro.backward_extra_bytes;
        o.forward_seconds = ro.forward_seconds;
        o.backward_seconds = ro.backward_seconds;
      }
    }
    const int64_t global = 12;
    const auto costs_at = [&](int64_t batch) { return simulated_table_at(base, aligned_slope, batch); };
    const CostTable at_global = costs_at(global);
    const int64_t unchecked_peak = remat::simulate(at_global.unchecked_plan(), at_global).peak_bytes;
    const int64_t budget = unchecked_peak * (25 + 15 * trial) / 100;

    // Brute force.
    double best_rate = 0;
    int64_t best_micro = 0;
    const auto lists = all_item_lists(0, 4);
    for (const int64_t m : {1, 2, 3, 4, 6, 12}) {
      const CostTable t = costs_at(m);
      Plan plan = template_for(t);
      std::function<void(int)> each_option = [&](int stage) {
        if (stage == 5) {
          for (const auto& items : lists) {
            plan.items = items;
            const auto p = remat::simulate(plan, t);
            if (p.peak_bytes > budget || p.step_seconds <= 0) continue;
            const double rate = static_cast<double>(m) / p.step_seconds;
            if (rate > best_rate || (rate == best_rate && m > best_micro)) {
              best_rate = rate;
              best_micro = m;
            }
          }
          return;
        }
        for (const auto& o : t.stages[stage].options) {
          plan.options[stage] = o.option;
          each_option(stage + 1);
        }
      };
      each_option(0);
    }

    const remat::ThroughputChoice choice =
        remat::plan_throughput(costs_at, global, remat::Budget::bytes(budget),
                               remat::ThroughputOptions().planner(remat::PlannerOptions().memory_slots(budget)));
    ASSERT_EQ(choice.frontier.size(), 6u);
    if (best_micro == 0) {
      EXPECT_FALSE(choice.best.has_value());
      REMAT_EXPECT_ERROR(choice.chosen(), "no micro-batch of the global batch 12 fits");
      continue;
    }
    ASSERT_TRUE(choice.best.has_value());
    EXPECT_EQ(choice.chosen().micro_batch, best_micro);
    EXPECT_DOUBLE_EQ(choice.chosen().predicted_samples_per_second, best_rate);
    EXPECT_EQ(choice.chosen().accumulation * choice.chosen().micro_batch, global);
    for (const auto& f : choice.frontier) {
      if (f.planned.feasible) EXPECT_LE(f.planned.prediction.peak_bytes, budget) << f.micro_batch;
      EXPECT_EQ(
          f.unchecked_fits,
          remat::simulate(costs_at(f.micro_batch).unchecked_plan(), costs_at(f.micro_batch)).peak_bytes <= budget);
    }
  }
}

TEST(Throughput, ProfilesTheEndsOfTheMicroBatchesAndOneBetween) {
  EXPECT_EQ(remat::default_profile_batches(16), (std::vector<int64_t>{16, 4, 1}));
  EXPECT_EQ(remat::default_profile_batches(64), (std::vector<int64_t>{64, 8, 1}));
  EXPECT_EQ(remat::default_profile_batches(12), (std::vector<int64_t>{12, 3, 1}));
  EXPECT_EQ(remat::default_profile_batches(7), (std::vector<int64_t>{7, 1}));
  EXPECT_EQ(remat::default_profile_batches(2), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(remat::default_profile_batches(1), (std::vector<int64_t>{1}));
  REMAT_EXPECT_ERROR(remat::default_profile_batches(0), "at least 1");
}

TEST(Throughput, InterpolatesLinearlyBetweenProfiledBatchSizesAndRefusesMismatchedTables) {
  std::mt19937 rng(3);
  const CostTable base = random_chain(rng, 4, 1);
  CostTable slope = base;
  for (auto& s : slope.stages) {
    s.output_bytes = 8;
    s.input_grad_bytes = 8;
    s.nograd_seconds = 0.5;
    for (auto& o : s.options) {
      o.kept_bytes = 16;
      o.forward_seconds = 0.25;
      o.backward_seconds = 0.5;
    }
  }
  const auto truth = [&](int64_t b) { return simulated_table_at(base, slope, b); };
  const std::vector<std::pair<int64_t, CostTable>> profiled = {{2, truth(2)}, {8, truth(8)}};
  for (const int64_t b : {1, 2, 5, 8, 16}) {
    const CostTable fitted = remat::interpolate_costs(profiled, b), expected = truth(b);
    for (size_t i = 0; i < expected.stages.size(); ++i) {
      EXPECT_EQ(fitted.stages[i].output_bytes, expected.stages[i].output_bytes) << b << " " << i;
      EXPECT_EQ(fitted.stages[i].options[0].kept_bytes, expected.stages[i].options[0].kept_bytes) << b << " " << i;
      EXPECT_NEAR(fitted.stages[i].options[0].backward_seconds, expected.stages[i].options[0].backward_seconds, 1e-9);
      EXPECT_NEAR(fitted.stages[i].nograd_seconds, expected.stages[i].nograd_seconds, 1e-9);
    }
  }
  const remat::InterpolationCheck exact = remat::check_interpolation({{2, truth(2)}, {4, truth(4)}, {8, truth(8)}});
  EXPECT_EQ(exact.worst_batch, 4);
  EXPECT_LT(exact.peak_error, 1e-9);
  EXPECT_LT(exact.step_error, 1e-9);

  // A bent law (per-sample time halves above batch 4, as when kernels amortise their overheads):
  // exact at every profiled size, linear between neighbours, never below zero beyond them.
  const auto bent = [&](int64_t b) {
    CostTable t = truth(b);
    if (b > 4) {
      for (auto& s : t.stages) s.options[0].backward_seconds = truth(4).stages[0].options[0].backward_seconds;
    }
    return t;
  };
  const std::vector<std::pair<int64_t, CostTable>> three = {{16, bent(16)}, {1, bent(1)}, {4, bent(4)}};
  for (const int64_t b : {1, 4, 16}) {
    EXPECT_DOUBLE_EQ(remat::interpolate_costs(three, b).stages[2].options[0].backward_seconds,
                     bent(b).stages[2].options[0].backward_seconds);
  }
  const double at1 = bent(1).stages[2].options[0].backward_seconds, at4 = bent(4).stages[2].options[0].backward_seconds,
               at16 = bent(16).stages[2].options[0].backward_seconds;
  EXPECT_NEAR(remat::interpolate_costs(three, 2).stages[2].options[0].backward_seconds, at1 + (at4 - at1) / 3, 1e-12);
  EXPECT_NEAR(remat::interpolate_costs(three, 8).stages[2].options[0].backward_seconds, at4 + (at16 - at4) / 3, 1e-12);
  const remat::InterpolationCheck bend = remat::check_interpolation(three);
  EXPECT_EQ(bend.worst_batch, 4);
  EXPECT_GT(bend.step_error, 0.01);  // the bend is seen, not averaged away
  // Below the profiled sizes the nearest segment continues, clipped at zero.
  CostTable falling = truth(2);
  for (auto& s : falling.stages) s.options[0].backward_seconds = 0.1;
  CostTable steep = truth(4);
  for (auto& s : steep.stages) s.options[0].backward_seconds = 10.0;
  EXPECT_EQ(remat::interpolate_costs({{2, falling}, {4, steep}}, 1).stages[0].options[0].backward_seconds, 0.0);

  CostTable renamed = truth(8);
  renamed.stages[1].name = "other";
  REMAT_EXPECT_ERROR(remat::interpolate_costs({{2, truth(2)}, {8, renamed}}, 4), "the profiles differ at");
  REMAT_EXPECT_ERROR(remat::interpolate_costs({{2, truth(2)}}, 4), "needs profiles at two batch sizes or more");
  REMAT_EXPECT_ERROR(remat::plan_throughput([&](int64_t b) { return truth(b); }, 12, "50%",
                                            remat::ThroughputOptions().micro_batches({5})),
                     "micro-batch 5 does not divide the global batch 12");
}
