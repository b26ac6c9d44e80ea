// remat/base/threads.h: the CPU threads as the user set them, detected, rearranged while timing and put back.
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/base/threads.h"
#include "remat/chain/sequential_chain.h"
#include "remat/measure/plan_measurement.h"
#include "remat/measure/profiler.h"
#include "support/timing.h"

namespace nn = torch::nn;
using remat::testing::KeepThreads;
using remat::testing::oversubscribed_arrangement;
using remat::testing::Quiet;
using remat::testing::QuietImpl;
using remat::testing::sample;
using remat::testing::steady;
using remat::testing::sum_loss;

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
  const auto measured = remat::measure_plans(chain, {remat::Plan::unchecked(chain)}, sample(), 2);
  const remat::CpuThreads seen = t.seen();
  EXPECT_EQ(remat::cpu_threads(), users);
  EXPECT_EQ(seen.oversubscribed(), false) << seen;
  EXPECT_EQ(measured[0].threads.find("put back") != std::string::npos, users.oversubscribed()) << measured[0].threads;
  remat::measure_plans(chain, {remat::Plan::unchecked(chain)}, sample(), 1, {}, remat::ThreadsWhileTiming::as_found);
  EXPECT_EQ(t.seen(), users);
}
