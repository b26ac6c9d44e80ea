// remat/planning/planner.h: the dynamic program is optimal (equal to brute force over every nested plan on random
// heterogeneous chains), its plans replay to its cost, it is monotone in the budget and reduces to Revolve's binomial
// count on uniform chains; the classic planners read blocks; every planner's plan trains like `none`.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/chain/plan.h"
#include "remat/models/estimator.h"
#include "remat/models/gpt.h"
#include "remat/planning/planner.h"
#include "remat/train/trainer.h"
#include "support/compare.h"
#include "support/cost_tables.h"
#include "support/profiled_gpt.h"

using remat::CostTable;
using remat::Plan;
using remat::PlanItem;
using remat::models::GptGranularity;
using remat::testing::all_item_lists;
using remat::testing::chain_with_blocks;
using remat::testing::equal_stages;
using remat::testing::kInf;
using remat::testing::random_chain;
using remat::testing::small;
using remat::testing::template_for;

namespace {

// Brute force: least simulated time of any plan (items × options) whose simulated peak fits.
std::vector<double> brute_force(const CostTable& t, int64_t max_budget,
                                remat::CheckpointMode mode = remat::CheckpointMode::reentrant) {
  std::vector<double> best(max_budget + 1, kInf);
  const int n = static_cast<int>(t.stages.size());
  Plan plan = template_for(t, mode);
  const auto lists = all_item_lists(0, n - 1);
  std::function<void(int)> each_option = [&](int stage) {
    if (stage == n) {
      for (const auto& items : lists) {
        plan.items = items;
        const auto p = remat::simulate(plan, t);
        for (int64_t m = std::max<int64_t>(p.peak_bytes, 0); m <= max_budget; ++m)
          best[m] = std::min(best[m], p.step_seconds);
      }
      return;
    }
    for (const auto& o : t.stages[stage].options) {
      plan.options[stage] = o.option;
      each_option(stage + 1);
    }
  };
  each_option(0);
  return best;
}

// The dynamic program as it was before its table kept only each range's window of slots: every
// range, every slot from 0 to `slots`, segments of any length (bytes are units: memory_slots equal
// to the largest budget). The planner's windowed table must give the same least time everywhere.
std::vector<double> dense_least_seconds(const CostTable& c, int64_t slots, remat::CheckpointMode mode) {
  const int64_t n = static_cast<int64_t>(c.stages.size());
  const int64_t row = slots + 1;
  std::vector<double> table(static_cast<size_t>(n * n * row), kInf);
  auto at = [&](int64_t s, int64_t t, int64_t m) -> double& {
    return table[static_cast<size_t>((s * n + t) * row + m)];
  };
  auto read = [&](int64_t s, int64_t t, int64_t m) { return m < 0 ? kInf : at(s, t, std::min(m, slots)); };
  std::vector<int64_t> parameters_before(n + 1, 0);
  for (int64_t k = 0; k < n; ++k) parameters_before[k + 1] = parameters_before[k] + c.stages[k].parameter_bytes;
  auto held = [&](int64_t first, int64_t t) -> int64_t {
    if (mode == remat::CheckpointMode::non_reentrant || t >= n - 1 || first > t) return 0;
    return parameters_before[t + 1] - parameters_before[first] + c.stages[t].output_bytes;
  };
  for (int64_t length = 1; length <= n; ++length) {
    for (int64_t s = 0; s + length - 1 < n; ++s) {
      const int64_t t = s + length - 1;
      const auto& first = c.stages[s];
      const int64_t grad_t = c.stages[t].output_bytes;
      for (const auto& option : first.options) {
        const auto& o = s == t && t < n - 1 ? option.at_segment_end() : static_cast<const remat::StageRunCost&>(option);
        const double seconds = o.forward_seconds + o.backward_seconds + (t < n - 1 ? first.recompute_extra_seconds : 0);
        const int64_t lowest = std::max(
            grad_t + o.kept_bytes + o.forward_extra_bytes,
            first.output_bytes + o.kept_bytes + first.input_grad_bytes + o.backward_extra_bytes + held(s + 1, t));
        for (int64_t m = lowest; m <= slots; ++m) {
          at(s, t, m) = std::min(at(s, t, m), seconds + (s == t ? 0.0 : read(s + 1, t, m - o.kept_bytes)));
        }
      }
      double forward_seconds = c.segment_seconds();
      int64_t forward_peak = 0;
      for (int64_t j = s + 1; j <= t; ++j) {
        const int64_t k = j - 1;
        const int64_t held_input = k == s ? 0 : c.stages[k - 1].output_bytes;
        forward_peak = std::max(forward_peak, c.segment_bytes + grad_t + held_input + c.stages[k].output_bytes +
                                                  c.stages[k].nograd_extra_bytes);
        forward_seconds += c.stages[k].nograd_seconds;
        const int64_t x = c.stages[k].output_bytes;
        const int64_t in_backward = 2 * c.segment_bytes + held(j, t);
        const int64_t lowest = std::max(forward_peak, std::max(x + c.segment_bytes, in_backward));
        for (int64_t m = lowest; m <= slots; ++m) {
          at(s, t, m) = std::min(at(s, t, m),
                                 forward_seconds + read(j, t, m - x - c.segment_bytes) + read(s, k, m - in_backward));
        }
      }
    }
  }
  std::vector<double> least(static_cast<size_t>(row));
  for (int64_t m = 0; m <= slots; ++m) least[static_cast<size_t>(m)] = at(0, n - 1, m);
  return least;
}

int64_t binomial(int64_t n, int64_t k) {
  int64_t r = 1;
  for (int64_t i = 1; i <= k; ++i) r = r * (n - k + i) / i;
  return r;
}

// Every stage a checkpointed segment of `plan` runs, at any depth.
std::vector<int64_t> checkpointed_stages(const Plan& plan) {
  std::vector<int64_t> out;
  for (const auto& item : plan.items) {
    if (item.is_stage()) continue;
    const auto range = remat::stage_range(item.segment);
    for (int64_t s = range.first; s <= range.second; ++s) out.push_back(s);
  }
  return out;
}

}  // namespace

TEST(Planner, NestedPlanCountsAreTheSchroederNumbers) {
  // 1, 2, 6, 22, 90, 394, 1806, 8558 plans of 1..8 stages (before stage options).
  const std::vector<size_t> expected = {1, 2, 6, 22, 90, 394, 1806, 8558};
  for (int n = 1; n <= 8; ++n) EXPECT_EQ(all_item_lists(0, n - 1).size(), expected[n - 1]) << n;
}

TEST(Planner, DynamicProgramEqualsBruteForceOnRandomChainsForEveryBudget) {
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 24; ++trial) {
    const int n = 1 + trial % 7;  // 1..7 stages (8 below, with one option, to bound the run time)
    const CostTable costs = random_chain(rng, n, n <= 5 ? 2 : 1);
    const int64_t max_budget = 70;
    const auto expected = brute_force(costs, max_budget);
    const remat::OptimalPlanner planner(costs, remat::PlannerOptions().memory_slots(max_budget), max_budget);
    ASSERT_EQ(planner.unit_bytes(), 1);
    double previous = kInf;
    for (int64_t m = 0; m <= max_budget; ++m) {
      SCOPED_TRACE("trial " + std::to_string(trial) + ", " + std::to_string(n) + " stages, budget " +
                   std::to_string(m));
      const double least = planner.least_seconds(m);
      ASSERT_EQ(least, expected[m]);
      EXPECT_LE(least, previous) << "cost rose with the budget";
      previous = least;
      const auto result = planner.plan(m);
      ASSERT_EQ(result.feasible, expected[m] < kInf);
      if (!result.feasible) continue;
      EXPECT_EQ(result.prediction.step_seconds, least) << "the plan does not replay to the table's cost";
      EXPECT_LE(result.prediction.peak_bytes, m);
    }
  }
}

TEST(Planner, NonReentrantPlansHoldNoParameterGradientsAndTheProgramStillEqualsBruteForce) {
  const auto non_reentrant = remat::CheckpointMode::non_reentrant;
  std::mt19937 rng(99);
  for (int trial = 0; trial < 12; ++trial) {
    const int n = 2 + trial % 5;
    const CostTable costs = random_chain(rng, n, 2);
    const int64_t max_budget = 70;
    const auto expected = brute_force(costs, max_budget, non_reentrant);
    const remat::OptimalPlanner planner(costs, remat::PlannerOptions().mode(non_reentrant).memory_slots(max_budget),
                                        max_budget);
    for (int64_t m = 0; m <= max_budget; ++m) {
      ASSERT_EQ(planner.least_seconds(m), expected[m]) << "trial " << trial << ", budget " << m;
      const auto result = planner.plan(m);
      if (result.feasible) EXPECT_EQ(result.plan.mode, non_reentrant);
    }
  }
  // One segment around two stages with large parameters: reentrant holds the second's gradients
  // (100 bytes) while back-propagating the first, non-reentrant does not.
  CostTable costs = random_chain(rng, 3, 1);
  for (auto& stage : costs.stages) stage.parameter_bytes = 100;
  Plan plan = template_for(costs);
  plan.items = {PlanItem::checkpointed({PlanItem::run(0), PlanItem::run(1)}), PlanItem::run(2)};
  const int64_t reentrant_peak = remat::simulate(plan, costs).peak_bytes;
  plan.mode = non_reentrant;
  const int64_t non_reentrant_peak = remat::simulate(plan, costs).peak_bytes;
  EXPECT_GT(reentrant_peak, non_reentrant_peak);
  EXPECT_LE(reentrant_peak - non_reentrant_peak, 100);
}

TEST(Planner, DynamicProgramEqualsBruteForceOnEightStages) {
  std::mt19937 rng(7);
  const CostTable costs = random_chain(rng, 8, 1);
  const auto expected = brute_force(costs, 60);
  const remat::OptimalPlanner planner(costs, remat::PlannerOptions().memory_slots(60), 60);
  for (int64_t m = 0; m <= 60; ++m) ASSERT_EQ(planner.least_seconds(m), expected[m]) << "budget " << m;
}

// Chains too long for brute force: the windowed table equals the dense one at every budget, in both
// modes, with segments of any length, and its plans replay to its cost.
TEST(Planner, WindowedTableEqualsTheDenseDynamicProgramOnLongerChains) {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 16; ++trial) {
    const int n = 9 + 3 * trial;  // 9..54 stages
    const auto mode = trial % 2 == 0 ? remat::CheckpointMode::reentrant : remat::CheckpointMode::non_reentrant;
    const CostTable costs = random_chain(rng, n, 1 + trial % 3);
    const int64_t slots = 12 * n;  // from infeasible to beyond the unchecked peak
    const auto expected = dense_least_seconds(costs, slots, mode);
    const remat::OptimalPlanner planner(costs, remat::PlannerOptions().mode(mode).memory_slots(slots), slots);
    ASSERT_EQ(planner.unit_bytes(), 1);
    EXPECT_EQ(planner.max_segment_stages(), n) << "uncapped";
    int feasible = 0;
    for (int64_t m = 0; m <= slots; ++m) {
      SCOPED_TRACE("trial " + std::to_string(trial) + ", " + std::to_string(n) + " stages, budget " +
                   std::to_string(m));
      ASSERT_EQ(planner.least_seconds(m), expected[static_cast<size_t>(m)]);
      if (m % 7 != 0 || expected[static_cast<size_t>(m)] == kInf) continue;
      const auto result = planner.plan(m);
      ASSERT_TRUE(result.feasible);
      EXPECT_LE(result.prediction.step_seconds, expected[static_cast<size_t>(m)]);
      EXPECT_LE(result.prediction.peak_bytes, m);
      ++feasible;
    }
    EXPECT_GT(feasible, 0) << "no budget in range was feasible: the test would check nothing";
  }
}

TEST(Planner, ATableFilledOnTwoThreadsEqualsOneFilledOnOne) {
  // 320 stages: the middle lengths weigh enough candidates to be split between threads.
  std::mt19937 rng(7);
  const CostTable costs = random_chain(rng, 320, 2);
  const int64_t slots = 1000;
  const int previous = at::get_num_threads();
  auto planner_on = [&](int threads) {
    at::set_num_threads(threads);
    return remat::OptimalPlanner(costs, remat::PlannerOptions().memory_slots(slots));
  };
  const remat::OptimalPlanner one = planner_on(1), two = planner_on(2);
  at::set_num_threads(previous);
  ASSERT_EQ(one.unit_bytes(), two.unit_bytes());
  EXPECT_EQ(two.max_segment_stages(), 320) << "uncapped";
  EXPECT_EQ(one.least_feasible_budget_bytes(), two.least_feasible_budget_bytes());
  int feasible = 0;
  for (int64_t m = 0; m <= slots; ++m) {
    const int64_t budget = m * one.unit_bytes();
    ASSERT_EQ(one.least_seconds(budget), two.least_seconds(budget)) << "budget " << budget;
    if (m % 10 != 0 || one.least_seconds(budget) == kInf) continue;
    EXPECT_EQ(one.plan(budget).plan.to_string(), two.plan(budget).plan.to_string()) << "budget " << budget;
    ++feasible;
  }
  EXPECT_GT(feasible, 10) << "too few feasible budgets: the test would check little";
}

TEST(Planner, InfeasibleBudgetReportsTheLeastFeasibleOne) {
  std::mt19937 rng(3);
  const CostTable costs = random_chain(rng, 6, 2);
  const remat::OptimalPlanner planner(costs, remat::PlannerOptions().memory_slots(100), 100);
  const int64_t least = planner.least_feasible_budget_bytes();
  ASSERT_GT(least, 0);
  EXPECT_FALSE(planner.plan(least - 1).feasible);
  EXPECT_TRUE(planner.plan(least).feasible);
  EXPECT_EQ(planner.plan(least - 1).least_feasible_budget_bytes, least);
}

TEST(Planner, ReducesToRevolvesBinomialCountOnAUniformChain) {
  // Revolve's model: taping a step costs more memory than two of them can share (kept = K), a
  // snapshot of a state costs 1, backward costs no time, every forward 1. A stage's gradient is as
  // large as its output (1), and Revolve does not count it: with memory K + 1 + c the
  // optimal plan runs l + (r·l − β(c+1, r−1)) forwards (β(c, r−1) < l ≤ β(c, r)): each step is
  // taped once, plus Revolve's least number of extra forward steps (e.g. 180 for l = 50, c = 3).
  const int64_t K = 1000;
  for (int64_t l : {2, 5, 10, 20, 35, 50}) {  // l = 50, c = 3: 180 extra forwards
    CostTable t;
    t.granularity = "uniform";
    for (int64_t i = 0; i < l; ++i) {
      remat::StageCost s;
      s.name = "s" + std::to_string(i);
      s.output_bytes = 1;
      s.nograd_seconds = 1;
      s.options = {{"full", 1.0, 0.0, K, 0, 0}};
      t.stages.push_back(s);
    }
    for (int64_t c = 1; c <= 4; ++c) {
      const int64_t memory = K + 1 + c;
      // Non-reentrant: a segment's backward holds nothing beyond its boundary, as Revolve's
      // snapshots do (a reentrant one also holds the gradient of its output until it returns).
      const remat::OptimalPlanner planner(
          t, remat::PlannerOptions().memory_slots(memory).mode(remat::CheckpointMode::non_reentrant), memory);
      int64_t r = 0;
      while (binomial(c + r, c) < l) ++r;
      const double revolve_extra = static_cast<double>(r * l - binomial(c + 1 + r - 1, c + 1));
      EXPECT_EQ(planner.least_seconds(memory) - static_cast<double>(l), revolve_extra) << "l = " << l << ", c = " << c;
    }
  }
}

TEST(Planner, ALongChainPlansWithinBoundedMemoryWithShorterSegments) {
  std::mt19937 rng(11);
  const CostTable costs = random_chain(rng, 1000, 3);
  const remat::OptimalPlanner planner(costs);
  // The full table would be 500,500 ranges × 1001 slots (6 GB, minutes); segments are shortened.
  EXPECT_LT(planner.max_segment_stages(), 1000);
  EXPECT_GE(planner.max_segment_stages(), 16);
  const int64_t least = planner.least_feasible_budget_bytes();
  ASSERT_GT(least, 0);
  EXPECT_TRUE(planner.plan(least).feasible) << "the least-memory plan fits its own peak, whatever the rounding";
  Plan plain = template_for(costs);
  for (int i = 0; i < 1000; ++i) plain.items.push_back(PlanItem::run(i));
  const int64_t half = remat::simulate(plain, costs).peak_bytes / 2;
  const remat::PlanResult r = planner.plan(half);
  ASSERT_TRUE(r.feasible);
  EXPECT_LE(r.prediction.peak_bytes, half);
  r.plan.check_nesting("test");
  // Segments are no longer than the planner says.
  std::vector<const std::vector<PlanItem>*> lists{&r.plan.items};
  while (!lists.empty()) {
    const auto* items = lists.back();
    lists.pop_back();
    for (const auto& item : *items) {
      if (item.is_stage()) continue;
      const auto range = remat::stage_range(item.segment);
      EXPECT_LE(range.second - range.first + 1, planner.max_segment_stages());
      lists.push_back(&item.segment);
    }
  }
}

TEST(Planner, AChainTooLongForAnyTableIsAClearErrorAtOnce) {
  std::mt19937 rng(5);
  const CostTable costs = random_chain(rng, 100000, 1);
  const std::string message = remat::testing::error_of([&] { remat::OptimalPlanner{costs}; });
  for (const char* fragment :
       {"planner: a chain of 100000 stages with 1000 memory slots", "coarser granularity", "fewer memory slots"}) {
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
  }
}

// The planning API: budgets say their unit, results are statuses tagged by planner, plans take
// their names from the cost table, and the classic planners read blocks, not positions.

TEST(PlanningApi, PlansTakeNamesGranularityAndModeFromTheCostTable) {
  std::mt19937 rng(4);
  CostTable costs = random_chain(rng, 6, 2);
  costs.granularity = "mine";
  const auto mode = remat::CheckpointMode::non_reentrant;
  const remat::PlanResult r = remat::plan_optimal(costs, "80%", remat::PlannerOptions().mode(mode));
  ASSERT_TRUE(r.feasible);
  EXPECT_EQ(r.planner, remat::PlannerKind::optimal);
  EXPECT_EQ(r.plan.granularity, "mine");
  EXPECT_EQ(r.plan.mode, mode);
  ASSERT_EQ(r.plan.stage_names.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(r.plan.stage_names[i], costs.stages[i].name);
    EXPECT_EQ(r.plan.default_options[i], costs.stages[i].options.front().option);
  }
  EXPECT_EQ(r.unchecked.peak_bytes, remat::simulate(costs.unchecked_plan(mode), costs).peak_bytes);
  EXPECT_EQ(r.budget_bytes, r.unchecked.peak_bytes * 80 / 100);
  EXPECT_LE(r.prediction.peak_bytes, r.budget_bytes);
}

TEST(PlanningApi, AnImpossibleBudgetIsAStatusAndEnsureFeasibleNamesTheLeastBudget) {
  std::mt19937 rng(9);
  const CostTable costs = random_chain(rng, 7, 2);
  const int64_t least = remat::least_feasible_budget(costs);
  ASSERT_GT(least, 0);
  const remat::PlanResult fits = remat::plan_optimal(costs, remat::Budget::bytes(least));
  EXPECT_TRUE(fits.feasible);
  EXPECT_EQ(&fits.ensure_feasible(), &fits);
  const remat::PlanResult no = remat::plan_optimal(costs, remat::Budget::bytes(least - 1));
  EXPECT_FALSE(no.feasible);
  EXPECT_TRUE(no.plan.items.empty());
  // One meaning: the least budget is the same whichever budget the table was built for.
  EXPECT_EQ(no.least_feasible_budget_bytes, least);
  EXPECT_EQ(fits.least_feasible_budget_bytes, least);
  EXPECT_EQ(remat::plan_optimal(costs, "300%").least_feasible_budget_bytes, least);
  REMAT_EXPECT_ERROR(no.ensure_feasible(), "the smallest feasible budget is " + std::to_string(least) + " bytes");
}

TEST(PlanningApi, ChenAndRevolveLeaveStagesOutsideBlocksPlainAndCheckpointEveryBlockStage) {
  // Blocks are stages 1..4 of 6: Chen never puts stages 0 and 5 in a segment, whatever the budget.
  const CostTable ends_outside = chain_with_blocks(6, 1, 4);
  int plans_seen = 0;
  for (const char* budget : {"40%", "60%", "80%"}) {
    const remat::PlanResult r = remat::chen_greedy_plan(ends_outside, budget);
    if (r.plan.items.empty()) continue;
    ++plans_seen;
    for (int64_t s : checkpointed_stages(r.plan)) EXPECT_TRUE(s >= 1 && s <= 4) << budget << ": " << r.plan.to_string();
  }
  EXPECT_GT(plans_seen, 0);
  // Revolve's uniform chain is the block stages' mean: the stages outside blocks keep their own costs.
  const remat::PlanResult revolve = remat::revolve_plan(ends_outside, "1000%");
  ASSERT_TRUE(revolve.feasible);
  EXPECT_EQ(revolve.planner, remat::PlannerKind::revolve);
  // Every stage a block (a Sequential without a loss): Chen's least-memory plans checkpoint the
  // first and the last stage too (before, they were exempt by position).
  const CostTable all_blocks = chain_with_blocks(6, 0, 5);
  const remat::PlanResult chen = remat::chen_greedy_plan(all_blocks, "1000%");
  ASSERT_TRUE(chen.feasible);
  const remat::PlanResult tight =
      remat::chen_greedy_plan(all_blocks, remat::Budget::bytes(chen.least_feasible_budget_bytes));
  ASSERT_TRUE(tight.feasible);
  const auto stages = checkpointed_stages(tight.plan);
  EXPECT_NE(std::find(stages.begin(), stages.end(), 0), stages.end()) << tight.plan.to_string();
  EXPECT_NE(std::find(stages.begin(), stages.end(), 5), stages.end()) << tight.plan.to_string();
  EXPECT_EQ(chen.planner, remat::PlannerKind::chen);
}

TEST(PlanningApi, ComparisonsAreTaggedByKind) {
  const CostTable costs = chain_with_blocks(6, 1, 4);
  const auto results = remat::compare_planners(
      costs, "50%", {"everything", "nothing"},
      [&costs](const std::string& name) {
        Plan p = costs.unchecked_plan();
        if (name == "everything") p.items = {PlanItem::checkpointed(p.items)};
        return p;
      },
      [&costs](const Plan& p) { return remat::simulate(p, costs); });
  ASSERT_EQ(results.size(), 4u);
  EXPECT_EQ(results[0].planner, remat::PlannerKind::policy);
  EXPECT_EQ(results[0].name, "everything");
  EXPECT_EQ(results[0].least_feasible_budget_bytes, results[0].prediction.peak_bytes);
  EXPECT_EQ(results[1].name, "nothing");
  EXPECT_FALSE(results[1].feasible);  // the unchecked plan never fits 50% of itself
  EXPECT_EQ(results[2].planner, remat::PlannerKind::revolve);
  EXPECT_EQ(results[3].planner, remat::PlannerKind::chen);
  for (const auto& r : results) EXPECT_EQ(r.budget_bytes, results[0].unchecked.peak_bytes / 2);
}

TEST(SegmentCost, ADearSegmentMakesThePlannerChooseFewerLongerOnes) {
  // Ten equal stages; at a budget fitting both one segment per stage and a few long ones, a cheap
  // segment favours the many (less recompute of kept boundaries), a dear one the few.
  remat::CostTable costs = equal_stages(10);
  auto segments_of = [](const remat::Plan& plan) {
    int64_t count = 0;
    std::vector<const std::vector<remat::PlanItem>*> levels{&plan.items};
    while (!levels.empty()) {
      const auto* items = levels.back();
      levels.pop_back();
      for (const auto& item : *items) {
        if (!item.is_stage()) {
          ++count;
          levels.push_back(&item.segment);
        }
      }
    }
    return count;
  };
  const remat::PlanResult cheap = remat::plan_optimal(costs, "45%");
  costs.segment_forward_seconds = 1e-3;  // ten stages' worth of forward
  const remat::PlanResult dear = remat::plan_optimal(costs, "45%");
  ASSERT_TRUE(cheap.feasible && dear.feasible);
  EXPECT_LT(segments_of(dear.plan), segments_of(cheap.plan))
      << cheap.plan.to_string() << " / " << dear.plan.to_string();
  EXPECT_DOUBLE_EQ(dear.prediction.step_seconds, remat::simulate(dear.plan, costs).step_seconds);
}

TEST(Planners, EveryPlannersPlanTrainsLikeNone) {
  remat::train::TrainOptions base;
  base.model = small();
  base.batch = 4;
  base.seed = 3;
  const std::string plan_file =
      (std::filesystem::temp_directory_path() / ("remat-planning-test-" + std::to_string(::getpid()) + ".json"))
          .string();
  auto run = [&](std::optional<Plan> plan) {
    remat::train::TrainOptions o = base;
    if (plan) {
      std::ofstream(plan_file) << plan->to_json();
      o.plan = remat::PlanRequest::of_plan_file(plan_file);
    }
    remat::train::Trainer trainer(o);
    std::vector<double> losses;
    for (int i = 0; i < 3; ++i) losses.push_back(trainer.step().loss);
    std::vector<at::Tensor> parameters;
    for (const auto& t : trainer.model()->parameters()) parameters.push_back(t.detach().clone());
    return std::make_pair(losses, parameters);
  };
  const auto none = run(std::nullopt);
  remat::models::EstimateOptions eo;
  eo.batch = 4;
  eo.granularity = GptGranularity::half;
  const CostTable costs = remat::models::estimate_gpt(small(), eo).costs;
  const Plan plain = Plan::unchecked(remat::models::GptChainShape(4, GptGranularity::half));
  const remat::OptimalPlanner optimal(costs, remat::PlannerOptions().memory_slots(500));
  const int64_t unchecked = remat::simulate(plain, costs).peak_bytes;
  std::vector<std::pair<std::string, Plan>> plans;
  for (double f : {0.25, 0.5, 0.8}) {
    const auto r = optimal.plan(static_cast<int64_t>(f * unchecked));
    if (r.feasible) plans.emplace_back("optimal " + std::to_string(f), r.plan);
  }
  const auto revolve = remat::revolve_plan(costs, "50%");
  if (revolve.feasible) plans.emplace_back("revolve", revolve.plan);
  const auto chen = remat::chen_greedy_plan(costs, "50%");
  if (chen.feasible) plans.emplace_back("chen", chen.plan);
  ASSERT_GE(plans.size(), 4u);
  for (const auto& [name, plan] : plans) {
    SCOPED_TRACE(name + ": " + plan.to_string());
    const auto outcome = run(plan);
    // Against the same stage options unchecked: checkpointing changes nothing, to the bit. (Options
    // such as fused compute differently by design; their own tests compare them with full.)
    Plan same_options = plain;
    same_options.options = plan.options;
    const auto reference = plan.options == plain.options ? none : run(same_options);
    EXPECT_EQ(outcome.first, reference.first);
    for (size_t i = 0; i < reference.second.size(); ++i) {
      EXPECT_TRUE(remat::testing::bitwise_equal(reference.second[i], outcome.second[i])) << i;
    }
  }
}
