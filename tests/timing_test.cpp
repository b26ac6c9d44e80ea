// Timing a user can trust: the CPU threads as the user set them (detected, rearranged while timing,
// put back), a profile that knows each stage's noise (a noisy stage gets more runs and a wider
// interval), and a choice by measurement between plans the cost model cannot tell apart.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/planning/budget_planner.h"
#include "remat/internal/statistics.h"
#include "remat/measure/plan_measurement.h"
#include "remat/planning/planned.h"
#include "remat/chain/policies.h"
#include "remat/planning/profiler.h"
#include "remat/chain/sequential_chain.h"
#include "remat/base/threads.h"
#include "support/models.h"

namespace nn = torch::nn;

namespace {

// Puts the process's threads back however a test ends.
struct KeepThreads {
  remat::CpuThreads saved = remat::cpu_threads();
  ~KeepThreads() {
    try {
      remat::restore_cpu_threads(saved);
    } catch (const c10::Error&) {
      at::set_num_threads(saved.intra_op);  // more threads than CPUs (test_main's 2 on one CPU)
    }
  }
};

// The arrangement LibTorch's defaults give a program on this machine, oversubscribed wherever
// OpenBLAS has its pool and there are two CPUs or more: both pools a thread per CPU (no more:
// restore_cpu_threads bounds each pool by the CPUs).
remat::CpuThreads oversubscribed_arrangement() {
  remat::CpuThreads threads = remat::cpu_threads();
  threads.intra_op = threads.cpus;
  if (threads.blas > 0) threads.blas = threads.cpus;
  return threads;
}

// A stage that sleeps in its forward (`milliseconds` gives each call's duration) and records the
// threads it ran under; its output is its input times a parameter, so that it has a backward.
struct SleepyImpl : nn::Module {
  explicit SleepyImpl(std::function<double()> milliseconds)
      : milliseconds_(std::move(milliseconds)), scale(register_parameter("scale", torch::ones({1}))) {}
  at::Tensor forward(const at::Tensor& x) {
    seen = remat::cpu_threads();
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(milliseconds_()));
    return x * scale;
  }
  std::function<double()> milliseconds_;
  at::Tensor scale;
  remat::CpuThreads seen;
};
TORCH_MODULE(Sleepy);

// Distinct classes: distinct stage signatures, so the profiler does not pool their times as twins.
struct QuietImpl : SleepyImpl {
  using SleepyImpl::SleepyImpl;
};
TORCH_MODULE(Quiet);
struct NoisyImpl : SleepyImpl {
  using SleepyImpl::SleepyImpl;
};
TORCH_MODULE(Noisy);

// Uniform in [0, 40) ms, the same sequence on every run: wide enough that a loaded machine's
// oversleeping (a few ms per call) cannot make it look steady.
std::function<double()> scattered() {
  auto state = std::make_shared<uint64_t>(12345);
  return [state] {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return 40.0 * static_cast<double>(*state >> 11) / static_cast<double>(1ULL << 53);
  };
}

std::function<double()> steady(double milliseconds) {
  return [milliseconds] { return milliseconds; };
}

at::Tensor sample() { return torch::randn({4, 8}); }

remat::LossFunction sum_loss() {
  return [](const at::Tensor& y) { return y.sum(); };
}

}  // namespace

TEST(Threads, OversubscribedMeansBothPoolsAboveOneAndMoreThreadsThanCpus) {
  EXPECT_TRUE((remat::CpuThreads{2, 2, 2}).oversubscribed());
  EXPECT_TRUE((remat::CpuThreads{4, 4, 4}).oversubscribed());
  EXPECT_FALSE((remat::CpuThreads{2, 1, 2}).oversubscribed());  // set_cpu_threads(2)
  EXPECT_FALSE((remat::CpuThreads{2, 2, 1}).oversubscribed());
  EXPECT_FALSE((remat::CpuThreads{2, 2, 0}).oversubscribed());  // no BLAS pool of its own
  EXPECT_FALSE((remat::CpuThreads{4, 2, 2}).oversubscribed());
  EXPECT_EQ((remat::CpuThreads{2, 2, 2}).to_string(),
            "2 LibTorch intra-op + 2 OpenBLAS threads on 2 CPUs (oversubscribed)");
  EXPECT_EQ((remat::CpuThreads{1, 1, 0}).to_string(), "1 LibTorch intra-op thread on 1 CPU");
}

TEST(Threads, SetCpuThreadsGivesTheCoresToOneArrangementAndRefusesMoreThanTheCpus) {
  KeepThreads keep;
  const int cpus = remat::usable_cpus();
  const remat::CpuThreads set = remat::set_cpu_threads(cpus);
  EXPECT_FALSE(set.oversubscribed()) << set;
  EXPECT_EQ(set, remat::cpu_threads());
  if (set.blas > 0) {
    EXPECT_EQ(set.intra_op, 1);
    EXPECT_EQ(set.blas, cpus);
  } else {
    EXPECT_EQ(set.intra_op, cpus);
  }
  try {
    remat::set_cpu_threads(cpus + 1);
    FAIL() << "more threads than CPUs accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("may run on " + std::to_string(cpus)), std::string::npos)
        << e.what_without_backtrace();
  }
  EXPECT_THROW(remat::set_cpu_threads(0), c10::Error);
}

// Issue 39: restore_cpu_threads checked lower bounds only; 64 or 100,000 threads hung OpenBLAS
// under a process limit while set_cpu_threads refused them. Each pool now has set_cpu_threads' bound.
TEST(Threads, RestoreCpuThreadsBoundsEachPoolAsSetCpuThreadsDoes) {
  KeepThreads keep;
  const int cpus = remat::usable_cpus();
  const remat::CpuThreads before = remat::cpu_threads();
  auto error_of = [](const remat::CpuThreads& threads) {
    try {
      remat::restore_cpu_threads(threads);
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  for (const int many : {cpus + 1, 64, 100000}) {
    if (many <= cpus) continue;
    const std::string intra = error_of(remat::CpuThreads{cpus, many, 0});
    EXPECT_NE(intra.find("intra-op threads (CpuThreads::intra_op): " + std::to_string(many) +
                         " CPU threads asked for, but this process may run on " + std::to_string(cpus)),
              std::string::npos)
        << intra;
    EXPECT_NE(intra.find("give 1 to " + std::to_string(cpus)), std::string::npos) << intra;
    const std::string blas = error_of(remat::CpuThreads{cpus, 1, many});
    EXPECT_NE(blas.find("OpenBLAS threads (CpuThreads::blas): " + std::to_string(many) + " CPU threads asked for"),
              std::string::npos)
        << blas;
    // set_cpu_threads says the same, in the same words: one check.
    try {
      remat::set_cpu_threads(many);
      ADD_FAILURE() << many << " threads accepted by set_cpu_threads";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find(" CPU threads asked for, but this process may run on "),
                std::string::npos);
    }
  }
  EXPECT_NE(error_of(remat::CpuThreads{cpus, 0, 0}).find("must be at least 1, got 0"), std::string::npos);
  EXPECT_NE(error_of(remat::CpuThreads{cpus, 1, -1}).find("must be 0 (no pool)"), std::string::npos);
  EXPECT_EQ(remat::cpu_threads(), before) << "a refused arrangement changed the threads";
  // What cpu_threads() returns within the bounds is put back.
  remat::CpuThreads within = before;
  within.intra_op = cpus;
  if (within.blas > 0) within.blas = 1;
  remat::restore_cpu_threads(within);
  EXPECT_EQ(remat::cpu_threads(), within);
}

namespace {

// A two-stage chain whose second stage records the threads it runs under, in a process whose
// threads are set as LibTorch's defaults set them (put back when the test ends).
struct UserThreads {
  UserThreads() : net(nn::Linear(8, 8), Quiet(steady(0))), chain(net, sum_loss()) { remat::restore_cpu_threads(users); }
  remat::CpuThreads seen() { return net[1]->as<QuietImpl>()->seen; }
  KeepThreads keep;
  remat::CpuThreads users = oversubscribed_arrangement();
  nn::Sequential net;
  remat::SequentialChain chain;
};

}  // namespace

TEST(Threads, TheProfilerTimesUnderTheArrangementAndPutsTheCallersBack) {
  UserThreads t;
  remat::SequentialChain& chain = t.chain;
  const remat::CpuThreads& users = t.users;
  ASSERT_EQ(remat::cpu_threads(), users);
  const remat::CostTable costs = remat::profile_chain(chain, sample(), remat::ProfileOptions().repeats(1));
  const remat::CpuThreads seen = t.seen();  // during the profile's last stage runs
  EXPECT_EQ(remat::cpu_threads(), users) << "the caller's threads were not put back";
  if (users.oversubscribed()) {
    EXPECT_FALSE(seen.oversubscribed()) << seen;
    EXPECT_NE(costs.threads.find("put back"), std::string::npos) << costs.threads;
    EXPECT_NE(costs.threads.find(users.to_string()), std::string::npos) << costs.threads;
  } else {  // no OpenBLAS pool here: nothing to rearrange
    EXPECT_EQ(seen, users);
    EXPECT_EQ(costs.threads, users.to_string());
  }
  // As found, when asked: the profile then times the oversubscribed arrangement itself.
  const remat::CostTable as_found = remat::profile_chain(
      chain, sample(), remat::ProfileOptions().repeats(1).threads(remat::ThreadsWhileTiming::as_found));
  EXPECT_EQ(t.seen(), users);
  EXPECT_EQ(as_found.threads, users.to_string());
}

TEST(Threads, MeasurePlansTimesUnderTheArrangementAndPutsTheCallersBack) {
  UserThreads t;
  remat::SequentialChain& chain = t.chain;
  const remat::CpuThreads& users = t.users;
  const auto measured = remat::measure_plans(chain, {remat::Plan::plain(chain)}, sample(), 2);
  const remat::CpuThreads seen = t.seen();
  EXPECT_EQ(remat::cpu_threads(), users);
  EXPECT_EQ(seen.oversubscribed(), false) << seen;
  EXPECT_EQ(measured[0].threads.find("put back") != std::string::npos, users.oversubscribed()) << measured[0].threads;
  remat::measure_plans(chain, {remat::Plan::plain(chain)}, sample(), 1, {}, remat::ThreadsWhileTiming::as_found);
  EXPECT_EQ(t.seen(), users);
}

TEST(Statistics, FewRunsThatHappenToLandCloseDoNotPinAScatteredStage) {
  // Two of three runs close together: the MAD alone (0.5 here) would call this within 5%.
  const double three = remat::median_spread({10.0, 10.5, 30.0});
  EXPECT_GT(three, 0.25 * 10.5) << three;
  EXPECT_GE(three, remat::median_spread({10.0, 30.0, 10.5, 10.4, 10.6, 10.5, 10.45}));
  // From six runs on, one slow run does not widen the interval (the shared machine's one outlier).
  const double six = remat::median_spread({10.0, 10.1, 9.9, 10.0, 10.05, 100.0});
  EXPECT_LT(six, 0.05 * 10.0) << six;
  EXPECT_EQ(remat::median_spread({7.0}), 0.0);
  EXPECT_GT(remat::median_spread({7.0, 8.0}), 0.0);
}

TEST(Profiler, ANoisyStageGetsMoreRunsAndAWiderInterval) {
  torch::manual_seed(0);
  nn::Sequential net(nn::Linear(8, 8), Quiet(steady(20)), Noisy(scattered()));
  remat::SequentialChain chain(net, sum_loss());
  const auto options =
      remat::ProfileOptions().repeats(3).max_repeats(15).tolerance(0.25).stage_seconds(20).in_step_seconds(1);
  const remat::CostTable costs = remat::profile_chain(chain, sample(), options);
  const remat::StageCost& quiet = costs.stages[1];
  const remat::StageCost& noisy = costs.stages[2];
  // A 20 ms sleep is pinned down within 25% by its first runs, even on a loaded machine (a sleep
  std::fprintf(stderr, "quiet %d rounds %.4f spread %.3f; noisy %d rounds %.4f spread %.3f\n", quiet.measured_rounds,
               quiet.options[0].forward_seconds + quiet.options[0].backward_seconds, quiet.relative_spread(),
               noisy.measured_rounds, noisy.options[0].forward_seconds + noisy.options[0].backward_seconds,
               noisy.relative_spread());
  // of 3 ms was not, in CI); sleeps scattered over 0-40 ms are not within 15, the most allowed.
  EXPECT_EQ(noisy.measured_rounds, 15);
  EXPECT_LT(quiet.measured_rounds, noisy.measured_rounds);
  EXPECT_GT(noisy.relative_spread(), 0.25);
  EXPECT_GT(noisy.relative_spread(), 2 * quiet.relative_spread());
  const std::vector<std::string> unstable = costs.unstable_stages(0.25);
  EXPECT_NE(std::find(unstable.begin(), unstable.end(), noisy.name), unstable.end());
  EXPECT_NE(costs.source.find("not within 25%"), std::string::npos) << costs.source;
  // A plan recomputing the noisy stage predicts a wider interval than one recomputing the quiet one.
  const remat::Plan plain = remat::Plan::plain(chain);
  remat::Plan recompute_quiet = plain, recompute_noisy = plain;
  recompute_quiet.items = {remat::PlanItem::run(0), remat::PlanItem::checkpointed({remat::PlanItem::run(1)}),
                           remat::PlanItem::run(2), remat::PlanItem::run(3)};
  recompute_noisy.items = {remat::PlanItem::run(0), remat::PlanItem::run(1),
                           remat::PlanItem::checkpointed({remat::PlanItem::run(2)}), remat::PlanItem::run(3)};
  const remat::Prediction unchecked = remat::simulate(plain, costs);
  const double quiet_spread = remat::predicted_overhead_spread(remat::simulate(recompute_quiet, costs), unchecked);
  const double noisy_spread = remat::predicted_overhead_spread(remat::simulate(recompute_noisy, costs), unchecked);
  EXPECT_GT(noisy_spread, 2 * quiet_spread);
  EXPECT_GT(remat::simulate(recompute_noisy, costs).step_seconds_spread, unchecked.step_seconds_spread * 0.5);
  // The spread survives a round trip through the table's file format.
  const remat::CostTable read = remat::CostTable::from_json(costs.to_json());
  EXPECT_DOUBLE_EQ(read.stages[2].spread_seconds, noisy.spread_seconds);
  EXPECT_EQ(read.threads, costs.threads);
}

TEST(Profiler, RefusesToleranceAndTimeLimitsThatCannotWork) {
  nn::Sequential net(nn::Linear(8, 8));
  remat::SequentialChain chain(net, sum_loss());
  // More repeats than max_repeats: the repeats are the fewest runs, so all of them are made.
  const remat::CostTable many = remat::profile_chain(
      chain, sample(), remat::ProfileOptions().repeats(17).max_repeats(3).stage_seconds(0).in_step_seconds(0));
  EXPECT_EQ(many.stages[0].measured_rounds, 17);
  EXPECT_THROW(remat::profile_chain(chain, sample(), remat::ProfileOptions().in_step_seconds(-1)), c10::Error);
  EXPECT_THROW(remat::profile_chain(chain, sample(), remat::ProfileOptions().tolerance(std::nan(""))), c10::Error);
  EXPECT_THROW(remat::profile_chain(chain, sample(), remat::ProfileOptions().tolerance(0)), c10::Error);
  EXPECT_THROW(remat::profile_chain(chain, sample(), remat::ProfileOptions().stage_seconds(-1)), c10::Error);
}

namespace {

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
    plain = remat::Plan::plain(chain);
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

TEST(PairedRatios, GiveTheMedianWithAnIntervalOfIt) {
  remat::PlanMeasurement a, b;
  for (int r = 0; r < 21; ++r) {
    b.all_step_seconds.push_back(1.0 + 0.01 * r);
    a.all_step_seconds.push_back((1.0 + 0.01 * r) * (1.2 + 0.01 * (r % 7 - 3)));
  }
  const remat::PairedRatio ratio = remat::paired_time_ratios(a, b);
  EXPECT_NEAR(ratio.median, 1.2, 1e-9);
  EXPECT_LT(ratio.low, ratio.median);
  EXPECT_GT(ratio.high, ratio.median);
  EXPECT_GE(ratio.low, 1.17 - 1e-9);
  EXPECT_LE(ratio.high, 1.23 + 1e-9);
  EXPECT_TRUE(ratio.contains(1.2));
  EXPECT_FALSE(ratio.contains(1.3));
  EXPECT_EQ(ratio.rounds, 21u);
}

TEST(MeasuredChoice, PlannedAndPlanForBudgetSayWhatTheyTimedUnderAndWhatTheyChose) {
  KeepThreads keep;
  remat::restore_cpu_threads(oversubscribed_arrangement());
  torch::manual_seed(0);
  nn::Sequential net = remat::testing::linear_gelu_stack(6, 32, 128);
  // The choice forced, so that what it reports is checked on any machine.
  const auto always = remat::MeasuredChoiceOptions().when(remat::ChooseByMeasurement::always).steps(3);
  remat::Planned planned(net, "60%", remat::PlannedOptions().planning(remat::BudgetPlanOptions().choice(always)));
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
