// The planners: the dynamic program is optimal (equal to brute force over every nested plan on
// random heterogeneous chains), its plans replay to its cost, it is monotone in the budget and
// reduces to Revolve's binomial count on uniform chains.
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/base/error.h"
#include "remat/planning/plan_comparison.h"
#include "remat/planning/plan_request.h"
#include "remat/planning/planner.h"
#include "remat/planning/throughput.h"
#include "support/compare.h"

using remat::CostTable;
using remat::Plan;
using remat::PlanItem;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A chain of n stages with random integer sizes and times; stage i offers `options` options.
CostTable random_chain(std::mt19937& rng, int n, int max_options) {
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  CostTable t;
  t.granularity = "test";
  t.segment_bytes = uniform(0, 2);
  t.segment_forward_seconds = uniform(0, 2);  // charged once per segment, by the program as by the simulator
  t.segment_backward_seconds = uniform(0, 1);
  for (int i = 0; i < n; ++i) {
    remat::StageCost s;
    s.name = "s" + std::to_string(i);
    s.output_bytes = uniform(1, 5);
    s.input_grad_bytes = i == 0 ? 0 : t.stages[i - 1].output_bytes;
    s.nograd_seconds = uniform(1, 4);
    s.nograd_extra_bytes = uniform(0, 3);
    s.parameter_bytes = uniform(0, 2);
    s.recompute_extra_seconds = uniform(0, 2);  // charged per recompute, by the program as by the simulator
    const int options = uniform(1, max_options);
    for (int o = 0; o < options; ++o) {
      remat::StageOptionCost c;
      c.option = "o" + std::to_string(o);
      c.forward_seconds = uniform(1, 5);
      c.backward_seconds = uniform(1, 8);
      c.kept_bytes = s.output_bytes + uniform(0, 6);
      c.forward_extra_bytes = uniform(0, 3);
      c.backward_extra_bytes = uniform(0, 4);
      if (uniform(0, 1) == 1) {  // graph-only as a segment's last stage: cheaper, output not kept
        remat::StageRunCost g = c;
        g.forward_seconds = uniform(0, static_cast<int>(c.forward_seconds));
        g.kept_bytes = c.kept_bytes - s.output_bytes + uniform(0, 1);
        g.forward_extra_bytes = uniform(0, 3);
        g.backward_extra_bytes = uniform(0, 4);
        c.graph_only = g;
      }
      s.options.push_back(c);
    }
    t.stages.push_back(s);
  }
  return t;
}

Plan template_for(const CostTable& t, remat::CheckpointMode mode = remat::CheckpointMode::reentrant) {
  Plan p;
  p.granularity = t.granularity;
  p.mode = mode;
  for (const auto& s : t.stages) {
    p.stage_names.push_back(s.name);
    p.options.push_back(s.options.front().option);
  }
  return p;
}

// Every nested plan over stages [s, t] in the planner's space (a segment never ends at the end of
// its enclosing range), as item lists.
std::vector<std::vector<PlanItem>> all_item_lists(int s, int t) {
  std::vector<std::vector<PlanItem>> out;
  if (s > t) return {{}};
  for (auto& rest : all_item_lists(s + 1, t)) {  // run s
    std::vector<PlanItem> items{PlanItem::run(s)};
    items.insert(items.end(), rest.begin(), rest.end());
    out.push_back(items);
  }
  for (int j = s + 1; j <= t; ++j) {  // checkpoint s..j-1
    for (auto& inner : all_item_lists(s, j - 1)) {
      for (auto& rest : all_item_lists(j, t)) {
        std::vector<PlanItem> items{PlanItem::checkpointed(inner)};
        items.insert(items.end(), rest.begin(), rest.end());
        out.push_back(items);
      }
    }
  }
  return out;
}

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

int64_t binomial(int64_t n, int64_t k) {
  int64_t r = 1;
  for (int64_t i = 1; i <= k; ++i) r = r * (n - k + i) / i;
  return r;
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

TEST(Planner, ParsesBudgets) {
  EXPECT_EQ(remat::Budget::parse("1024").to_bytes(0), 1024);
  EXPECT_EQ(remat::Budget::parse("2KiB").to_bytes(0), 2048);
  EXPECT_EQ(remat::Budget::parse("1.5MiB").to_bytes(0), 1572864);
  EXPECT_EQ(remat::Budget::parse("1GiB").to_bytes(0), int64_t{1} << 30);
  EXPECT_EQ(remat::Budget::parse("50%").to_bytes(1000), 500);
  for (const std::string bad : {"", "MiB", "12 parsecs", "5TB", "-3%"}) {
    try {
      remat::Budget::parse(bad).to_bytes(1000);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find("budget"), std::string::npos);
    }
  }
  // A 100,000-digit budget is refused without echoing it whole; 1e400 is out of range, not "not a number".
  const std::string digits =
      remat::testing::error_of([] { remat::Budget::parse(std::string(100000, '9')).to_bytes(100); });
  EXPECT_NE(digits.find("is out of range"), std::string::npos) << digits.substr(0, 200);
  EXPECT_LT(digits.size(), 400u);
  REMAT_EXPECT_ERROR(remat::Budget::parse("1e400").to_bytes(100), "budget '1e400' is out of range");
}

// Issue 39: hexadecimal, leading blanks, a sign and less than a byte were read as budgets (std::stod
// takes them all), and Budget::bytes(INT64_MAX) came back negative through a double.
TEST(Budget, RefusesWhatIsNotADecimalNumberOfBytesAndOverflow) {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"0x10MiB", "budget '0x10MiB' is hexadecimal; write the number in decimal"},
      {" \t50%", "budget ' \\t50%' does not start with a decimal number"},
      {"-0", "budget '-0' does not start with a decimal number"},
      {"+5MiB", "budget '+5MiB' does not start with a decimal number"},
      {"1e-5", "budget '1e-5' is less than one byte; give 0 or at least 1 byte"},
      {"1e-400", "budget '1e-400' is less than one byte"},
      {"0.5", "budget '0.5' is less than one byte"},
      {"1.MiB", "budget '1.MiB' does not start with a decimal number"},
      {"inf", "budget 'inf' does not start with a decimal number"},
      {"nan%", "budget 'nan%' does not start with a decimal number"},
      {"9PiB", "budget '9PiB' has an unknown unit 'PiB'"},
      {"9000000GiB", "budget '9000000GiB' is out of range: at most 2^53 bytes (8 PiB)"},
      {"5\xc2\x9b", "budget '5\\u009b' has an unknown unit '\\u009b'"}};
  for (const auto& [text, expected] : refused) {
    const std::string message = remat::testing::error_of([&] { remat::Budget::parse(text); });
    EXPECT_NE(message.find(expected), std::string::npos) << "'" << text << "': " << message;
    EXPECT_NE(message.find("write it as bytes (123456 or 123456B)"), std::string::npos)
        << "'" << text << "' is refused without the accepted forms: " << message;
  }
  EXPECT_EQ(remat::Budget::parse("0").to_bytes(100), 0);
  EXPECT_EQ(remat::Budget::parse("1e3").to_bytes(0), 1000);
  EXPECT_EQ(remat::Budget::parse("8192GiB").to_bytes(0), int64_t{1} << 43);
  EXPECT_EQ(remat::Budget::parse("0.3KiB").to_bytes(0), 307);

  // Exact to 2^53 bytes, and refused beyond it, absolute or a share of a peak alike.
  EXPECT_EQ(remat::Budget::bytes(remat::Budget::kMaxBytes).to_bytes(0), remat::Budget::kMaxBytes);
  EXPECT_EQ(remat::Budget::bytes(remat::Budget::kMaxBytes - 1).to_bytes(0), remat::Budget::kMaxBytes - 1);
  REMAT_EXPECT_ERROR(remat::Budget::bytes(INT64_MAX),
                     "a budget in bytes must be at most 2^53 (8 PiB), got 9223372036854775807");
  REMAT_EXPECT_ERROR(remat::Budget::percent(1000).to_bytes(INT64_MAX), "bytes, out of range: at most 2^53 (8 PiB)");
  REMAT_EXPECT_ERROR(remat::Budget::parse("50%").to_bytes(-1), "must not be negative, got -1 bytes");
  EXPECT_EQ(remat::Budget::percent(50).to_bytes(int64_t{1} << 53), int64_t{1} << 52);
}

TEST(Simulator, ChargesOnlyASegmentsLastStageItsGraphOnlyCosts) {
  std::mt19937 rng(7);
  CostTable costs = random_chain(rng, 5, 1);
  for (auto& s : costs.stages) s.options[0].graph_only.reset();
  Plan plan = template_for(costs);
  // s0 [s1 [s2] s3] s4: s2 ends the inner segment, s3 the outer one; s4 ends no segment.
  plan.items = {
      PlanItem::run(0),
      PlanItem::checkpointed({PlanItem::run(1), PlanItem::checkpointed({PlanItem::run(2)}), PlanItem::run(3)}),
      PlanItem::run(4)};
  const remat::Prediction plain = remat::simulate(plan, costs);
  auto faster = [&](int stage, double saved) {
    CostTable c = costs;
    remat::StageRunCost g = c.stages[stage].options[0];
    g.forward_seconds -= saved;
    c.stages[stage].options[0].graph_only = g;
    return remat::simulate(plan, c).step_seconds;
  };
  EXPECT_DOUBLE_EQ(faster(2, 0.5), plain.step_seconds - 0.5);
  EXPECT_DOUBLE_EQ(faster(3, 0.25), plain.step_seconds - 0.25);
  EXPECT_DOUBLE_EQ(faster(1, 0.5), plain.step_seconds) << "s1 is recomputed, but not last";
  EXPECT_DOUBLE_EQ(faster(4, 0.5), plain.step_seconds) << "s4 is never recomputed";
}

TEST(CostTable, GraphOnlyCostsRoundTripAndOlderProfilesFallBackToThePlainOnes) {
  std::mt19937 rng(11);
  CostTable costs = random_chain(rng, 4, 2);
  costs.stages[1].options[0].graph_only = remat::StageRunCost{0.5, 2.0, 333, 1, 2};
  const CostTable again = CostTable::from_json(costs.to_json());
  EXPECT_EQ(again.to_json(), costs.to_json());
  ASSERT_TRUE(again.stages[1].options[0].graph_only.has_value());
  EXPECT_EQ(again.stages[1].options[0].at_segment_end().kept_bytes, 333);

  const char* older = R"({"format": "remat-costs", "version": 1, "granularity": "block", "stages": [
    {"name": "s0", "output_bytes": 8, "input_grad_bytes": 0, "nograd_seconds": 1, "nograd_extra_bytes": 0,
     "options": [{"option": "full", "forward_seconds": 1, "backward_seconds": 2, "kept_bytes": 16,
                  "forward_extra_bytes": 0, "backward_extra_bytes": 0}]}]})";
  const CostTable old = CostTable::from_json(older, "old.json");
  EXPECT_FALSE(old.stages[0].options[0].graph_only.has_value());
  EXPECT_EQ(old.stages[0].options[0].at_segment_end().kept_bytes, 16) << "absent: the plain costs stand in";
  EXPECT_EQ(old.stages[0].recompute_extra_seconds, 0) << "absent: no charge, as before it was measured";
  EXPECT_NE(costs.to_json().find("\"recompute_extra_seconds\""), std::string::npos);

  std::string negative = costs.to_json();
  const std::string field = "\"kept_bytes\": 333";
  ASSERT_NE(negative.find(field), std::string::npos);
  negative.replace(negative.find(field), field.size(), "\"kept_bytes\": -333");
  REMAT_EXPECT_ERROR(CostTable::from_json(negative, "bad.json"),
                     "bad.json: stages[1].options[0].graph_only: field 'kept_bytes' must be a whole number of bytes "
                     "from 0 to 2^53 (8 PiB), found -333.");
  std::string missing = costs.to_json();
  missing.replace(missing.find(field), field.size(), "\"kept\": 333");
  REMAT_EXPECT_ERROR(CostTable::from_json(missing, "bad.json"),
                     "bad.json: stages[1].options[0].graph_only: field 'kept_bytes' is missing.");
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
namespace {

// n stages; stages [first_block, last_block] in blocks 0, 1, ...; the rest outside any block.
CostTable chain_with_blocks(int n, int first_block, int last_block) {
  std::mt19937 rng(21);
  CostTable t = random_chain(rng, n, 1);
  for (int i = 0; i < n; ++i) t.stages[i].block = i >= first_block && i <= last_block ? i - first_block : -1;
  return t;
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

TEST(Budget, SaysItsUnitAndIntegersDoNotConvert) {
  static_assert(!std::is_convertible<int, remat::Budget>::value, "an integer budget's unit would be a guess");
  static_assert(!std::is_convertible<int64_t, remat::Budget>::value, "an integer budget's unit would be a guess");
  static_assert(std::is_convertible<const char*, remat::Budget>::value, "text says its unit");
  EXPECT_EQ(remat::Budget::bytes(1234).to_bytes(1 << 20), 1234);
  EXPECT_FALSE(remat::Budget::bytes(1234).is_relative());
  EXPECT_EQ(remat::Budget::percent(25).to_bytes(1000), 250);
  EXPECT_EQ(remat::Budget::fraction(0.25).to_bytes(1000), 250);
  EXPECT_TRUE(remat::Budget::fraction(0.25).is_relative());
  EXPECT_EQ(remat::Budget::percent(25).text(), "25%");
  EXPECT_EQ(remat::Budget("2KiB").to_bytes(0), 2048);
  REMAT_EXPECT_ERROR(remat::Budget::bytes(-1), "must not be negative");
  REMAT_EXPECT_ERROR(remat::Budget::percent(0), "percentage must be in (0, 1000]");
  REMAT_EXPECT_ERROR(remat::Budget::fraction(std::nan("")), "must be in (0, 10]");
}

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
  EXPECT_EQ(r.unchecked.peak_bytes, remat::simulate(costs.plain_plan(mode), costs).peak_bytes);
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
        Plan p = costs.plain_plan();
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

TEST(PlanningApi, CostTablesKeepTheirBlocks) {
  const CostTable costs = chain_with_blocks(5, 1, 3);
  const CostTable again = CostTable::from_json(costs.to_json());
  for (size_t i = 0; i < costs.stages.size(); ++i) EXPECT_EQ(again.stages[i].block, costs.stages[i].block);
  std::string bad = costs.to_json();
  bad.replace(bad.find("\"block\": -1"), 11, "\"block\": -7");
  REMAT_EXPECT_ERROR(CostTable::from_json(bad, "b.json"), "b.json: stages[0]: field 'block' must be -1");
}

// One decision, made once: a policy, a given plan or a budget, in a mode.
TEST(PlanRequest, ChoosesAPolicyAPlanOrTheOptimalPlanForABudget) {
  const CostTable costs = chain_with_blocks(6, 1, 4);
  int costs_asked = 0;
  remat::ProfileOptions profiled_with;
  remat::PlanSources sources;
  sources.policy = [&costs](const std::string& policy) {
    REMAT_CHECK(policy == "all", "unknown policy '", policy, "'");
    Plan p = costs.plain_plan();
    p.items = {PlanItem::checkpointed(p.items)};
    return p;
  };
  sources.costs = [&](const remat::ProfileOptions& options) {
    profiled_with = options;
    ++costs_asked;
    return costs;
  };
  const auto non_reentrant = remat::CheckpointMode::non_reentrant;

  const remat::ChosenPlan policy =
      remat::choose_plan(remat::PlanRequest::of_policy("all").mode(non_reentrant), sources);
  EXPECT_EQ(policy.plan.mode, non_reentrant);
  EXPECT_EQ(policy.source, "policy all");
  EXPECT_FALSE(policy.planned.has_value());
  EXPECT_EQ(costs_asked, 0) << "a policy needs no cost table";

  const remat::ChosenPlan given = remat::choose_plan(remat::PlanRequest::of_plan(policy.plan, "mine.json"), sources);
  EXPECT_EQ(given.plan.to_json(), policy.plan.to_json());
  EXPECT_EQ(given.source, "mine.json");

  remat::PlanRequest budget = remat::PlanRequest::of_budget("70%").mode(non_reentrant);
  budget.planner().memory_slots(500);
  budget.profile().repeats(2);
  const remat::ChosenPlan planned = remat::choose_plan(budget, sources);
  EXPECT_EQ(costs_asked, 1);
  // The request's profile reaches the model's profiler, in the plan's mode and with "sac".
  EXPECT_EQ(profiled_with.repeats(), 2);
  EXPECT_EQ(profiled_with.mode(), non_reentrant);
  EXPECT_TRUE(profiled_with.selective_option());
  ASSERT_TRUE(planned.planned.has_value());
  EXPECT_EQ(planned.plan.to_json(), planned.planned->plan.to_json());
  EXPECT_EQ(planned.plan.mode, non_reentrant);
  EXPECT_EQ(
      planned.plan.to_json(),
      remat::plan_optimal(costs, "70%", remat::PlannerOptions().mode(non_reentrant).memory_slots(500)).plan.to_json());
  EXPECT_EQ(planned.source.rfind("optimal for budget 70% = ", 0), 0u) << planned.source;

  REMAT_EXPECT_ERROR(remat::choose_plan(remat::PlanRequest::of_budget(remat::Budget::bytes(1)), sources),
                     "the smallest feasible budget is");
  REMAT_EXPECT_ERROR(remat::choose_plan(remat::PlanRequest::of_policy("none"), sources), "unknown policy 'none'");
  REMAT_EXPECT_ERROR(
      remat::choose_plan(remat::PlanRequest::of_budget("50%"), remat::PlanSources{sources.policy, nullptr}),
      "budget 50% needs PlanSources::costs");
  REMAT_EXPECT_ERROR(remat::PlanRequest::of_policy("all").budget(), "policy all holds no budget");
  REMAT_EXPECT_ERROR(remat::PlanRequest::of_plan_file("/nonexistent/plan.json"), "/nonexistent/plan.json");
}

// The measured comparison: each plan measured once, overheads paired against the unchecked plan,
// and the fastest policy measured to fit each budget (here "measured" by the simulator, with drift).
TEST(CompareMeasured, FindsTheFastestFittingPolicyWithPairedRatiosAndMeasuresEachPlanOnce) {
  const CostTable costs = chain_with_blocks(6, 1, 4);
  const int64_t least = remat::least_feasible_budget(costs);
  const int64_t unchecked_peak = remat::simulate(costs.plain_plan(), costs).peak_bytes;
  const std::vector<remat::PlanResult> optimal = {
      remat::plan_optimal(costs, remat::Budget::bytes(least + (unchecked_peak - least) / 4)),
      remat::plan_optimal(costs, remat::Budget::bytes(least + 3 * (unchecked_peak - least) / 4))};
  ASSERT_TRUE(optimal[0].feasible && optimal[1].feasible);
  std::vector<remat::NamedPlan> policies;
  for (const std::string& name : {"all", "pairs"}) {
    Plan p = costs.plain_plan();
    if (name == "all")
      p.items = {PlanItem::run(0),
                 PlanItem::checkpointed({PlanItem::run(1), PlanItem::run(2), PlanItem::run(3), PlanItem::run(4)}),
                 PlanItem::run(5)};
    if (name == "pairs")
      p.items = {PlanItem::run(0), PlanItem::checkpointed({PlanItem::run(1), PlanItem::run(2)}),
                 PlanItem::checkpointed({PlanItem::run(3), PlanItem::run(4)}), PlanItem::run(5)};
    policies.push_back({name, p});
  }
  policies.push_back({"again", policies[0].plan});  // the same plan under another name: measured once
  size_t measured_plans = 0;
  const auto measure = [&](const std::vector<Plan>& plans) {
    measured_plans += plans.size();
    std::vector<remat::PlanMeasurement> out;
    for (const auto& plan : plans) {
      const remat::Prediction p = remat::simulate(plan, costs);
      remat::PlanMeasurement m;
      m.activation_peak_bytes = p.peak_bytes;
      for (int round = 0; round < 5; ++round)
        m.all_step_seconds.push_back(p.step_seconds * (1 + 0.2 * round));  // drift
      m.step_seconds = m.all_step_seconds[2];
      out.push_back(m);
    }
    return out;
  };
  const remat::MeasuredComparison c = remat::compare_measured(costs.plain_plan(), optimal, policies, measure);
  const size_t distinct_optimal = optimal[0].plan.to_string() == optimal[1].plan.to_string() ? 1 : 2;
  EXPECT_LE(measured_plans, 1 + distinct_optimal + 2) << "each distinct plan once";
  EXPECT_DOUBLE_EQ(c.unchecked.overhead, 0.0);
  ASSERT_EQ(c.policies.size(), 3u);
  const double unchecked_seconds = remat::simulate(costs.plain_plan(), costs).step_seconds;
  for (size_t b = 0; b < 2; ++b) {
    const auto& bc = c.budgets[b];
    EXPECT_TRUE(bc.fits);
    EXPECT_NEAR(bc.measured.overhead, optimal[b].prediction.step_seconds / unchecked_seconds - 1, 1e-12);
    // Brute force: the fastest policy whose peak fits.
    std::optional<size_t> best;
    for (size_t p = 0; p < policies.size(); ++p) {
      const remat::Prediction pp = remat::simulate(policies[p].plan, costs);
      if (pp.peak_bytes > optimal[b].budget_bytes) continue;
      if (!best || pp.step_seconds < remat::simulate(policies[*best].plan, costs).step_seconds) best = p;
    }
    EXPECT_EQ(bc.best_policy.has_value(), best.has_value()) << b;
    if (best) {
      EXPECT_EQ(c.policies[*bc.best_policy].measured.step_seconds, c.policies[*best].measured.step_seconds);
      EXPECT_LE(bc.ratio_to_best_policy, 1.0 + 1e-12) << "the optimal plan is no slower than the best policy";
    }
  }
  std::vector<remat::PlanResult> infeasible = {remat::plan_optimal(costs, remat::Budget::bytes(1))};
  REMAT_EXPECT_ERROR(remat::compare_measured(costs.plain_plan(), infeasible, policies, measure),
                     "compare feasible results only");
}

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
    const int64_t unchecked_peak = remat::simulate(at_global.plain_plan(), at_global).peak_bytes;
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
      EXPECT_EQ(f.unchecked_fits,
                remat::simulate(costs_at(f.micro_batch).plain_plan(), costs_at(f.micro_batch)).peak_bytes <= budget);
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

// Issue 39: tables and plans built in code reached the simulator and the planners unchecked: a stage
// index of 99,999,999 or an empty table crashed simulate (SIGSEGV), a plan without stage options
// read out of bounds, plan_optimal crashed on a negative output_bytes (SIGSEGV) and on -inf seconds
// with INT64_MAX kept bytes (SIGBUS), and a NaN time was accepted. Each is now refused with the
// loader's checks (one function: CostTable::check_well_formed, Plan::check_well_formed).
TEST(PlanningApi, TablesAndPlansBuiltInCodeAreCheckedAsTheLoadersCheckThem) {
  std::mt19937 rng(39);
  const CostTable good = random_chain(rng, 4, 2);
  const Plan plain = good.plain_plan();
  ASSERT_NO_THROW(remat::simulate(plain, good));
  const remat::Budget half = remat::Budget::parse("50%");

  Plan far = plain;
  far.items[2] = PlanItem::run(99999999);
  REMAT_EXPECT_ERROR(remat::simulate(far, good),
                     "simulate: an item runs stage 99999999 but the plan has 4 stages (indices 0 to 3)");
  Plan nested_far = plain;
  nested_far.items = {PlanItem::run(0), PlanItem::checkpointed({PlanItem::run(1), PlanItem::run(-7 + 99999999)}),
                      PlanItem::run(3)};
  REMAT_EXPECT_ERROR(remat::simulate(nested_far, good), "but the plan has 4 stages");
  Plan twice = plain;
  twice.items[3] = PlanItem::run(2);
  REMAT_EXPECT_ERROR(remat::simulate(twice, good), "stages must appear once each, in chain order");
  Plan empty_segment = plain;
  empty_segment.items.insert(empty_segment.items.begin() + 1, PlanItem::checkpointed({}));
  REMAT_EXPECT_ERROR(remat::simulate(empty_segment, good), "a checkpointed segment is empty");
  Plan short_plan = plain;
  short_plan.items.pop_back();
  REMAT_EXPECT_ERROR(remat::simulate(short_plan, good), "the plan stops at stage 's3'; it must cover every stage");
  Plan no_options = plain;
  no_options.options.clear();
  REMAT_EXPECT_ERROR(remat::simulate(no_options, good),
                     "simulate: the plan has 0 stage options (Plan::options) for 4 stages; give one option per stage");
  Plan few_defaults = plain;
  few_defaults.default_options.resize(2);
  REMAT_EXPECT_ERROR(remat::simulate(few_defaults, good), "the plan has 2 default options");
  REMAT_EXPECT_ERROR(remat::simulate(Plan{}, CostTable{}), "simulate: the plan has no stages");
  REMAT_EXPECT_ERROR(remat::simulate(plain, CostTable{}), "simulate: the cost table: the cost table has no stages");

  // Each bad number, refused by name wherever the table enters: the simulator and every planner.
  struct Bad {
    std::function<void(CostTable&)> change;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {[](CostTable& t) { t.stages[1].output_bytes = -8; },
       "stages[1]: field 'output_bytes' must be a whole number of bytes from 0 to 2^53 (8 PiB), found -8."},
      {[](CostTable& t) { t.stages[2].options[0].forward_seconds = -kInf; },
       "stages[2].options[0]: field 'forward_seconds' must be a number of seconds, at least 0, found -inf."},
      {[](CostTable& t) { t.stages[2].options[0].kept_bytes = INT64_MAX; },
       "stages[2].options[0]: field 'kept_bytes' must be a whole number of bytes from 0 to 2^53"},
      {[](CostTable& t) { t.stages[0].options[0].backward_seconds = std::nan(""); },
       "stages[0].options[0]: field 'backward_seconds' must be a number of seconds, at least 0, found nan."},
      {[](CostTable& t) { t.stages[3].nograd_seconds = kInf; }, "field 'nograd_seconds'"},
      {[](CostTable& t) { t.segment_bytes = -1; },
       ": field 'segment_bytes' must be a whole number of bytes from 0 to 2^53"},
      {[](CostTable& t) {
         t.stages[1].options.back().graph_only = t.stages[1].options.back();
         t.stages[1].options.back().graph_only->backward_extra_bytes = -3;
       },
       ".graph_only: field 'backward_extra_bytes'"},
      {[](CostTable& t) {
         for (auto& s : t.stages) s.output_bytes = int64_t{1} << 52;  // each fine, their sum not
       },
       "the table's sizes add up to more than 2^53 bytes (8 PiB) by stages[1]"},
      {[](CostTable& t) { t.stages[1].block = 99; }, "stages[1]: field 'block' must be -1"},
      {[](CostTable& t) { t.stages[2].options.clear(); }, "stages[2]: stage 's2' has no options"},
  };
  for (const auto& b : bad) {
    CostTable table = good;
    b.change(table);
    SCOPED_TRACE(b.message);
    // The loader says the same, in the same words, of the same table written to a file (where the
    // file can hold it: JSON has no NaN or infinity).
    const std::string own = remat::testing::error_of([&] { table.check_well_formed("costs.json"); });
    EXPECT_NE(own.find("costs.json: "), std::string::npos) << own;
    EXPECT_NE(own.find(b.message), std::string::npos) << own;
    const std::string json = table.to_json();
    if (json.find("null") == std::string::npos) {
      EXPECT_EQ(remat::testing::error_of([&] { CostTable::from_json(json, "costs.json"); }), own);
    }
    REMAT_EXPECT_ERROR(remat::simulate(plain, table), "simulate: the cost table: ");
    REMAT_EXPECT_ERROR(remat::simulate(plain, table), b.message);
    REMAT_EXPECT_ERROR(remat::plan_optimal(table, half), "plan_optimal: the cost table: ");
    REMAT_EXPECT_ERROR(remat::plan_optimal(table, half), b.message);
    REMAT_EXPECT_ERROR(remat::least_feasible_budget(table), b.message);
    REMAT_EXPECT_ERROR((void)remat::OptimalPlanner(table, remat::PlannerOptions()), "planner: the cost table");
    REMAT_EXPECT_ERROR(remat::revolve_plan(table, half), "revolve: the cost table");
    REMAT_EXPECT_ERROR(remat::chen_greedy_plan(table, half), "chen: the cost table");
    REMAT_EXPECT_ERROR(remat::compare_planners(
                           table, half, {}, [&](const std::string&) { return plain; },
                           [&](const Plan& p) { return remat::simulate(p, table); }),
                       "compare_planners: the cost table");
    REMAT_EXPECT_ERROR(remat::interpolate_costs({{2, good}, {4, table}}, 3), "interpolate_costs: the table at batch 4");
    REMAT_EXPECT_ERROR(remat::plan_throughput([&](int64_t) { return table; }, 2, half), b.message);
  }
  // What each refusal says to do.
  REMAT_EXPECT_ERROR(
      [&] {
        CostTable t = good;
        t.stages[1].output_bytes = -8;
        remat::simulate(plain, t);
      }(),
      "found -8. Correct the table where it is made");
  // The good table still plans.
  EXPECT_NO_THROW(remat::plan_optimal(good, half));
  EXPECT_NO_THROW(remat::revolve_plan(good, half));
}
