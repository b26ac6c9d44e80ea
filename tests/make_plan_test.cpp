// remat/autoplan/make_plan.h: the one front door (a policy, a plan or a budget), and the steps of a budget's plan
// (autoplan/verified_plan.h): verified by measurement and re-planned, then chosen by measurement among near plans.
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "autoplan/verified_plan.h"
#include "remat/autoplan/make_plan.h"
#include "remat/autoplan/planned.h"
#include "remat/base/error.h"
#include "remat/chain/sequential_chain.h"
#include "remat/measure/plan_measurement.h"
#include "remat/measure/profiler.h"
#include "remat/memory/memory.h"
#include "remat/planning/planner.h"
#include "support/compare.h"
#include "support/cost_tables.h"
#include "support/models.h"
#include "support/planning.h"
#include "support/timing.h"

namespace nn = torch::nn;
namespace F = torch::nn::functional;
using remat::CostTable;
using remat::Plan;
using remat::PlanItem;
using remat::testing::chain_with_blocks;
using remat::testing::KeepThreads;
using remat::testing::Noisy;
using remat::testing::oversubscribed_arrangement;
using remat::testing::Quiet;
using remat::testing::sample;
using remat::testing::steady;
using remat::testing::sum_loss;

namespace {

// Six stages of Linear(32, 128), tanh, Linear(128, 32) with a loss; stage 2, when `hidden` is set,
// also keeps a tensor of `hidden_floats` for its backward that the profiler (run while it was off)
// never saw.
struct HiddenTransientChain {
  explicit HiddenTransientChain(int64_t hidden_floats) : hidden_floats(hidden_floats) {
    torch::manual_seed(0);
    std::vector<remat::SequentialStage> stages;
    for (int i = 0; i < 6; ++i) {
      nn::Linear widen(32, 128), narrow(128, 32);
      layers.push_back(widen);
      layers.push_back(narrow);
      stages.push_back({"s" + std::to_string(i),
                        [this, widen, narrow, i](const at::Tensor& x, const std::string&) mutable {
                          at::Tensor y = narrow(at::tanh(widen(x)));
                          if (i == 2 && hidden) {
                            // MulBackward saves `extra` for the gradient of y.sum(): held until backward.
                            const at::Tensor extra = at::ones({this->hidden_floats}, y.options());
                            y = y + (extra * y.sum()).sum() * 0;
                          }
                          return y;
                        },
                        {widen.ptr(), narrow.ptr()}});
    }
    target = torch::randn({64, 32});
    chain = std::make_unique<remat::SequentialChain>(
        std::move(stages), [this](const at::Tensor& out) { return F::mse_loss(out, target); });
  }
  int64_t hidden_floats;
  bool hidden = false;
  std::vector<nn::Linear> layers;
  at::Tensor target;
  std::unique_ptr<remat::SequentialChain> chain;
};

// Two stages of one kind whose recompute differs tenfold (1 ms and 10 ms asleep) and a table that
// gives both the same costs: plans recomputing one or the other are predicted alike.
struct EqualPredictions {
  EqualPredictions()
      : net(nn::Linear(8, 8), Quiet(steady(1)), Noisy(steady(10)), nn::Linear(8, 8)), chain(net, sum_loss()) {
    costs =
        remat::profile_chain(chain, sample(), remat::ProfileOptions().repeats(1).stage_seconds(0).in_step_seconds(0));
    remat::StageCost same = costs.stages[1];
    same.name = costs.stages[2].name;
    costs.stages[2] = same;
    plain = remat::Plan::unchecked(chain);
    light = heavy = plain;
    light.items = {remat::PlanItem::run(0), remat::PlanItem::checkpointed({remat::PlanItem::run(1)}),
                   remat::PlanItem::run(2), remat::PlanItem::run(3), remat::PlanItem::run(4)};
    heavy.items = {remat::PlanItem::run(0), remat::PlanItem::run(1),
                   remat::PlanItem::checkpointed({remat::PlanItem::run(2)}), remat::PlanItem::run(3),
                   remat::PlanItem::run(4)};
  }
  remat::PlanResult planned(const remat::Plan& plan) const {
    remat::PlanResult r;
    r.feasible = true;
    r.plan = plan;
    r.prediction = remat::simulate(plan, costs);
    r.unchecked = remat::simulate(plain, costs);
    r.budget_bytes = int64_t{1} << 40;
    return r;
  }
  nn::Sequential net;
  remat::SequentialChain chain;
  remat::CostTable costs;
  remat::Plan plain, light, heavy;
};

}  // namespace

// One decision, made once: a policy, a given plan or a budget, in a mode, through the one front door.
TEST(MakePlan, ChoosesAPolicyAPlanOrTheOptimalPlanForABudget) {
  const CostTable costs = chain_with_blocks(6, 1, 4);
  const auto all = [&costs](const std::string& policy) {
    REMAT_CHECK(policy == "all", "unknown policy '", policy, "'");
    Plan p = costs.unchecked_plan();
    p.items = {PlanItem::checkpointed(p.items)};
    return p;
  };
  const remat::PlanSubject subject = remat::PlanSubject(costs).policies(all);
  const auto non_reentrant = remat::CheckpointMode::non_reentrant;

  const remat::PlanResult policy = remat::make_plan(remat::PlanRequest::of_policy("all").mode(non_reentrant), subject);
  EXPECT_EQ(policy.plan.mode, non_reentrant);
  EXPECT_EQ(policy.source, "policy all");
  EXPECT_EQ(policy.planner, remat::PlannerKind::policy);
  EXPECT_TRUE(policy.feasible);

  const remat::PlanResult given = remat::make_plan(remat::PlanRequest::of_plan(policy.plan, "mine.json"), subject);
  EXPECT_EQ(given.plan.to_json(), policy.plan.to_json());
  EXPECT_EQ(given.source, "mine.json");

  remat::PlanRequest budget = remat::PlanRequest::of_budget("70%").mode(non_reentrant);
  budget.options().planner().memory_slots(500);
  const remat::PlanResult planned = remat::make_plan(budget, subject);
  EXPECT_EQ(planned.plan.mode, non_reentrant);
  EXPECT_EQ(
      planned.plan.to_json(),
      remat::plan_optimal(costs, "70%", remat::PlannerOptions().mode(non_reentrant).memory_slots(500)).plan.to_json());
  EXPECT_EQ(planned.source.rfind("optimal for budget 70% = ", 0), 0u) << planned.source;
  EXPECT_EQ(planned.measured_peak_bytes, -1) << "a cost table alone: nothing is run";
  EXPECT_FALSE(planned.measured_choice.measured);

  REMAT_EXPECT_ERROR(remat::make_plan(remat::PlanRequest::of_budget(remat::Budget::bytes(1)), subject),
                     "the smallest feasible budget is");
  REMAT_EXPECT_ERROR(remat::make_plan(remat::PlanRequest::of_policy("none"), subject), "unknown policy 'none'");
  REMAT_EXPECT_ERROR(remat::make_plan(remat::PlanRequest::of_budget("50%"), remat::PlanSubject().policies(all)),
                     "budget 50% needs the chain it is for");
  REMAT_EXPECT_ERROR(remat::make_plan(remat::PlanRequest::of_policy("block"), remat::PlanSubject(costs)),
                     "needs the chain it is made for");
  REMAT_EXPECT_ERROR(remat::PlanRequest::of_policy("all").budget(), "policy all holds no budget");
  REMAT_EXPECT_ERROR(remat::PlanRequest::of_plan_file("/nonexistent/plan.json"), "/nonexistent/plan.json");
}

TEST(PlanVerified, ReplansWhenAStageHidesMemoryFromTheProfiler) {
  remat::install_cpu_memory_tracker();
  HiddenTransientChain model(64 * 128);  // as much as a stage keeps, held by stage 2 until its backward
  const at::Tensor x = torch::randn({64, 32});
  const remat::CostTable costs = remat::profile_chain(*model.chain, x, remat::ProfileOptions().repeats(1));
  model.hidden = true;
  const remat::MeasurePeak measure = [&](const remat::Plan& plan) {
    return remat::measure_plan_peak(*model.chain, plan, x);
  };

  const remat::PlanResult unverified = remat::plan_optimal(costs, "60%");
  ASSERT_TRUE(unverified.feasible);
  const int64_t first_measured = measure(unverified.plan);
  ASSERT_GT(first_measured, unverified.budget_bytes) << "the hidden tensor does not break the plan: no test";

  const remat::PlanResult verified = remat::plan_verified(costs, "60%", {}, measure);
  ASSERT_TRUE(verified.feasible) << verified.plan.to_string();
  EXPECT_GE(verified.replans, 1);
  EXPECT_EQ(verified.budget_bytes, unverified.budget_bytes);
  EXPECT_LE(verified.measured_peak_bytes, verified.budget_bytes);
  EXPECT_EQ(verified.measured_peak_bytes, measure(verified.plan));
  EXPECT_LT(verified.prediction.peak_bytes, unverified.prediction.peak_bytes);
}

TEST(PlanVerified, SaysWhenNoPlanMeasuresWithinTheBudgetAndNamesTheLeastMeasured) {
  remat::install_cpu_memory_tracker();
  HiddenTransientChain model(64 * 32 * 64);  // more than the whole chain holds: no plan absorbs it
  const at::Tensor x = torch::randn({64, 32});
  const remat::CostTable costs = remat::profile_chain(*model.chain, x, remat::ProfileOptions().repeats(1));
  model.hidden = true;
  const remat::MeasurePeak measure = [&](const remat::Plan& plan) {
    return remat::measure_plan_peak(*model.chain, plan, x);
  };
  const int64_t least_predicted = remat::least_feasible_budget(costs);
  const remat::Budget budget = remat::Budget::bytes(least_predicted + 1024);
  const remat::PlanResult result = remat::plan_verified(costs, budget, {}, measure, 2);
  EXPECT_FALSE(result.feasible);
  EXPECT_GT(result.measured_peak_bytes, result.budget_bytes);
  EXPECT_GT(result.least_feasible_budget_bytes, result.budget_bytes);  // measured, not predicted
  EXPECT_LE(result.replans, 2);
  REMAT_EXPECT_ERROR(result.ensure_feasible(), "the smallest budget measured feasible");

  // Given what it names, it fits.
  const remat::PlanResult enough =
      remat::plan_verified(costs, remat::Budget::bytes(result.least_feasible_budget_bytes), {}, measure, 2);
  EXPECT_TRUE(enough.feasible);
  EXPECT_LE(enough.measured_peak_bytes, result.least_feasible_budget_bytes);
}

TEST(PlanVerified, PlanForBudgetReturnsAMeasuredPlanAndCanTrustThePrediction) {
  remat::install_cpu_memory_tracker();
  HiddenTransientChain model(16);
  const at::Tensor x = torch::randn({64, 32});
  const remat::PlanResult measured = remat::make_plan(
      remat::PlanRequest::of_budget("65%").options(remat::testing::quick_planning()), {*model.chain, x});
  EXPECT_GE(measured.measured_peak_bytes, 0);
  EXPECT_LE(measured.measured_peak_bytes, measured.budget_bytes);
  const remat::PlanResult trusted =
      remat::make_plan(remat::PlanRequest::of_budget("65%").options(remat::testing::quick_planning().max_replans(-1)),
                       {*model.chain, x});
  EXPECT_EQ(trusted.measured_peak_bytes, -1);
  EXPECT_EQ(trusted.replans, 0);
}

TEST(MeasuredChoice, KeepsTheTrulyFasterOfTwoPlansPredictedAlike) {
  torch::manual_seed(0);
  EqualPredictions e;
  ASSERT_DOUBLE_EQ(remat::simulate(e.light, e.costs).step_seconds, remat::simulate(e.heavy, e.costs).step_seconds);
  const at::Tensor x = sample();
  // Planned the slow one: the fast one measures faster beyond the spread and is kept.
  // 11 steps, up to 3 series: one round a loaded machine delays by 9 ms must not decide it.
  const remat::PlanResult switched = remat::choose_fastest(e.chain, e.costs, e.planned(e.heavy), {{"light", e.light}},
                                                           x, 11, remat::ThreadsWhileTiming::arranged, 3);
  ASSERT_TRUE(switched.measured_choice.measured);
  EXPECT_EQ(switched.plan.to_string(), e.light.to_string()) << switched.measured_choice.reason;
  EXPECT_EQ(switched.measured_choice.chosen, 1u);
  EXPECT_LT(switched.measured_choice.candidates[1].ratio_high, 1.0);
  EXPECT_TRUE(switched.measured_choice.candidates[1].fits);
  EXPECT_NE(switched.measured_choice.reason.find("'light' measured faster"), std::string::npos)
      << switched.measured_choice.reason;
  // Planned the fast one: it stays.
  const remat::PlanResult kept =
      remat::choose_fastest(e.chain, e.costs, e.planned(e.light), {{"heavy", e.heavy}}, x, 7);
  EXPECT_EQ(kept.plan.to_string(), e.light.to_string()) << kept.measured_choice.reason;
  EXPECT_EQ(kept.measured_choice.chosen, 0u);
  EXPECT_GT(kept.measured_choice.candidates[1].ratio, 1.0);
  // A faster plan that does not fit the budget is not kept.
  remat::PlanResult tight = e.planned(e.heavy);
  tight.budget_bytes = 0;
  const remat::PlanResult over = remat::choose_fastest(e.chain, e.costs, tight, {{"light", e.light}}, x, 3);
  EXPECT_EQ(over.plan.to_string(), e.heavy.to_string());
  EXPECT_FALSE(over.measured_choice.candidates[1].fits);
}

TEST(MeasuredChoice, SaysWhyItDidNotMeasure) {
  torch::manual_seed(0);
  EqualPredictions e;
  const at::Tensor x = sample();
  const remat::PlanResult never = remat::choose_by_measurement(
      e.chain, e.costs, e.planned(e.heavy), x, remat::MeasuredChoiceOptions().when(remat::ChooseByMeasurement::never));
  EXPECT_FALSE(never.measured_choice.measured);
  EXPECT_NE(never.measured_choice.reason.find("never"), std::string::npos) << never.measured_choice.reason;
  // The rules of thumb here (every block, segments, ...) predicted within the noise: named, fitting.
  const std::vector<remat::CandidatePlan> nearest =
      remat::nearest_rules_of_thumb(e.chain, e.costs, e.planned(e.heavy), remat::MeasuredChoiceOptions().margin(10));
  ASSERT_FALSE(nearest.empty());
  EXPECT_LE(nearest.size(), 3u);
  const remat::PlanResult too_long = remat::choose_by_measurement(
      e.chain, e.costs, e.planned(e.heavy), x, remat::MeasuredChoiceOptions().margin(10).max_seconds(0));
  EXPECT_FALSE(too_long.measured_choice.measured);
  EXPECT_NE(too_long.measured_choice.reason.find("max_seconds"), std::string::npos) << too_long.measured_choice.reason;
  EXPECT_EQ(too_long.plan.to_string(), e.heavy.to_string());
  EXPECT_THROW(
      remat::choose_by_measurement(e.chain, e.costs, e.planned(e.heavy), x, remat::MeasuredChoiceOptions().steps(0)),
      c10::Error);
}

TEST(MeasuredChoice, PlannedAndPlanForBudgetSayWhatTheyTimedUnderAndWhatTheyChose) {
  KeepThreads keep;
  remat::restore_cpu_threads(oversubscribed_arrangement());
  torch::manual_seed(0);
  nn::Sequential net = remat::testing::linear_gelu_stack(6, 32, 128);
  // The choice forced, so that what it reports is checked on any machine.
  const auto always = remat::MeasuredChoiceOptions().when(remat::ChooseByMeasurement::always).steps(3);
  remat::Planned planned(net, "60%", remat::PlannedOptions().planning(remat::PlanningOptions().choice(always)));
  planned->calibrate(torch::randn({64, 32}));
  const remat::PlanResult& result = planned->budget_plan();
  EXPECT_NE(result.timed_under.find("intra-op"), std::string::npos) << result.timed_under;
  EXPECT_EQ(result.timed_under.find("put back") != std::string::npos, oversubscribed_arrangement().oversubscribed())
      << result.timed_under;
  EXPECT_FALSE(result.measured_choice.reason.empty());
  EXPECT_GE(result.predicted_overhead_spread(), 0.0);
  std::ostringstream printed;
  planned->pretty_print(printed);
  EXPECT_NE(printed.str().find("timed under"), std::string::npos) << printed.str();
  // It measured, or found no rule of thumb within the noise; where it measured, the kept plan fits
  // and is the planned one or a candidate measured faster.
  EXPECT_TRUE(result.measured_choice.measured ||
              result.measured_choice.reason.find("no rule of thumb") != std::string::npos)
      << result.measured_choice.reason;
  if (result.measured_choice.measured) {
    const auto& kept = result.measured_choice.candidates[result.measured_choice.chosen];
    EXPECT_TRUE(kept.fits);
    EXPECT_EQ(kept.plan, result.plan.to_string());
    EXPECT_TRUE(result.measured_choice.chosen == 0 || kept.ratio_high < 1.0);
  }
}

// Any model's step through the same front door: make_plan records it (leaving gradients, buffers
// and the RNG as they were), plans it over its graph, and hands back the planned step.
TEST(MakePlan, AStepIsPlannedOverItsGraphBehindTheSameFrontDoor) {
  remat::install_cpu_memory_tracker();
  torch::manual_seed(5);
  nn::Linear first(64, 128), second(128, 128), out(256, 8);
  nn::BatchNorm1d norm(128);
  const at::Tensor x = torch::randn({512, 64});
  // Not a chain: `a` is read by the second layer and again by the concatenation.
  auto forward = [&] {
    const at::Tensor a = torch::relu(first(x));
    const at::Tensor b = torch::gelu(norm(second(F::dropout(a, F::DropoutFuncOptions().p(0.2)))));
    return out(torch::cat({a, b}, 1)).pow(2).mean();
  };
  std::vector<at::Tensor> state;
  for (auto* m : std::vector<nn::Module*>{first.get(), second.get(), out.get(), norm.get()}) {
    for (const auto& p : m->parameters()) state.push_back(p);
    for (const auto& b : m->buffers()) state.push_back(b);
  }
  std::vector<at::Tensor> buffers_before;
  for (const auto& b : norm->buffers()) buffers_before.push_back(b.clone());
  const at::Tensor rng_before = at::detail::getDefaultCPUGenerator().get_state();

  const remat::PlanResult r =
      remat::make_plan(remat::PlanRequest::of_budget("70%"), remat::PlanSubject::of_step(forward, state));
  EXPECT_EQ(r.planner, remat::PlannerKind::graph);
  ASSERT_NE(r.step, nullptr);
  ASSERT_TRUE(r.step->planned());
  EXPECT_GT(r.step->plan().dropped, 0);
  EXPECT_LE(r.prediction.peak_bytes, r.budget_bytes);
  EXPECT_EQ(r.measured_unchecked_peak_bytes, r.step->plan().unchecked_peak_bytes);
  EXPECT_NE(r.source.find("planned over the step's graph for budget 70%"), std::string::npos) << r.source;
  // Recording left the state as it was: no gradients, the same statistics, the same RNG stream.
  for (const auto& t : state) EXPECT_FALSE(t.requires_grad() && t.grad().defined());
  for (size_t i = 0; i < buffers_before.size(); ++i) EXPECT_TRUE(norm->buffers()[i].equal(buffers_before[i]));
  EXPECT_TRUE(at::detail::getDefaultCPUGenerator().get_state().equal(rng_before));

  // The first training step already runs under the plan, with the unplanned step's gradients.
  auto grads = [&] {
    std::vector<at::Tensor> g;
    for (const auto& t : state) {
      if (!t.requires_grad()) continue;
      g.push_back(t.grad().clone());
      t.mutable_grad() = at::Tensor();
    }
    return g;
  };
  torch::manual_seed(9);
  remat::reset_peak_memory();
  const int64_t before = remat::memory_stats().current_bytes;
  r.step->run(forward).backward();
  const int64_t peak = remat::memory_stats().peak_bytes - before;
  EXPECT_FALSE(r.step->last_run_recorded());
  const auto planned = grads();
  for (size_t i = 0; i < buffers_before.size(); ++i) norm->buffers()[i].copy_(buffers_before[i]);
  torch::manual_seed(9);
  forward().backward();
  const auto plain = grads();
  ASSERT_EQ(planned.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(remat::testing::bitwise_equal(planned[i], plain[i])) << i;
  EXPECT_LE(peak, r.budget_bytes);

  REMAT_EXPECT_ERROR(remat::make_plan(remat::PlanRequest::of_policy("block"), remat::PlanSubject::of_step(forward)),
                     "a step (PlanSubject::of_step) is planned for a budget");
  REMAT_EXPECT_ERROR(remat::PlanSubject::of_step(nullptr), "the step's forward is empty");
  REMAT_EXPECT_ERROR(
      remat::make_plan(remat::PlanRequest::of_budget("70%"), remat::PlanSubject::of_step([&] { return x.sum(); })),
      "must return the loss, one element that requires grad");
}
