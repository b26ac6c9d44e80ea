// remat/chain/chain.h: the generic stage option "sac" (kSacOption), accepted by every chain, put on blocks by the
// policy `sac`, and picked by a plan where keeping the matrix products pays.
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "autoplan/verified_plan.h"
#include "remat/chain/chain.h"
#include "remat/chain/plan.h"
#include "remat/chain/policies.h"
#include "remat/chain/sequential_chain.h"
#include "remat/measure/plan_measurement.h"
#include "remat/measure/profiler.h"
#include "remat/memory/memory.h"
#include "remat/planning/planner.h"
#include "support/checks.h"
#include "support/compare.h"

namespace nn = torch::nn;
using remat::testing::bitwise_equal;
using remat::testing::expect_error_containing;

namespace {

// A dear matrix product followed by a cheap elementwise tail that holds most of the stage's memory:
// keeping the product and recomputing the tail ("sac") costs little, recomputing the stage costs
// the product again.
struct ProductAndTailImpl : nn::Module {
  nn::Linear fc{nullptr};
  explicit ProductAndTailImpl(int64_t width) { fc = register_module("fc", nn::Linear(width, width)); }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = fc(x);
    return (y.tanh() * y.sigmoid()).sin().cos().mul(0.5) + x;
  }
};
TORCH_MODULE(ProductAndTail);

}  // namespace

TEST(SelectiveStageOption, EveryChainAcceptsItAndRunsItWithThePlainGradients) {
  torch::manual_seed(0);
  nn::Sequential net(ProductAndTail(32), ProductAndTail(32), ProductAndTail(32));
  const at::Tensor x = torch::randn({8, 32});
  remat::SequentialChain chain(net, [](const at::Tensor& out) { return out.pow(2).sum(); });
  EXPECT_EQ(chain.accepted_options(0), (std::vector<std::string>{"full", "sac"}));
  remat::Plan plan = remat::Plan::unchecked(chain);
  plan.options[1] = remat::kSacOption;
  plan.validate_against(chain);
  auto grads_under = [&](const remat::Plan& p) {
    net->zero_grad();
    remat::run_plan(chain, p, x).backward();
    std::vector<at::Tensor> grads;
    for (const auto& param : net->parameters()) grads.push_back(param.grad().clone());
    return grads;
  };
  const auto plain = grads_under(remat::Plan::unchecked(chain));
  const auto selective = grads_under(plan);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(bitwise_equal(plain[i], selective[i])) << i;
  plan.options[1] = "keep-everything";
  expect_error_containing([&] { plan.validate_against(chain); },
                          {"has no option 'keep-everything'", "it offers: full sac"});
}

TEST(SelectiveStageOption, ThePolicySacPutsItOnEveryBlock) {
  torch::manual_seed(0);
  nn::Sequential net(ProductAndTail(8), ProductAndTail(8), ProductAndTail(8), ProductAndTail(8));
  remat::SequentialChain chain(net, [](const at::Tensor& out) { return out.sum(); });
  EXPECT_EQ(remat::policy_plan("sac", chain).to_string(),
            "productandtail0:sac productandtail1:sac productandtail2:sac productandtail3:sac loss");
  EXPECT_EQ(remat::policy_plan("sac,skip-ends", chain).to_string(),
            "productandtail0 productandtail1:sac productandtail2:sac productandtail3 loss");
}

TEST(SelectiveStageOption, APlanPicksItWhereKeepingTheProductsPays) {
  remat::install_cpu_memory_tracker();
  torch::manual_seed(0);
  nn::Sequential net;
  for (int i = 0; i < 6; ++i) net->push_back(ProductAndTail(256));
  const at::Tensor x = torch::randn({512, 256});
  remat::SequentialChain chain(net, [](const at::Tensor& out) { return out.pow(2).mean(); });
  remat::CostTable costs = remat::profile_chain(chain, x, remat::ProfileOptions().sac_option(true));
  // Bytes are measured (exact); times are set, so the choice does not rest on a loaded machine's
  // noise: sac runs the stage's forward and adds a tenth of it to its backward (the tail's
  // recompute), a segment recomputes the whole forward.
  for (int i = 0; i < 6; ++i) {
    remat::StageCost& stage = costs.stages[i];
    const remat::StageOptionCost& full = stage.option("full");
    for (auto& o : stage.options) {
      if (o.option != remat::kSacOption) continue;
      o.forward_seconds = full.forward_seconds;
      o.backward_seconds = full.backward_seconds + 0.1 * full.forward_seconds;
      o.graph_only.reset();
    }
    stage.nograd_seconds = full.forward_seconds;
  }
  remat::Plan every_stage_selective = costs.unchecked_plan();
  for (int i = 0; i < 6; ++i) every_stage_selective.options[i] = remat::kSacOption;
  const remat::Prediction plain = remat::simulate(costs.unchecked_plan(), costs);
  const remat::Prediction selective = remat::simulate(every_stage_selective, costs);
  ASSERT_LT(selective.peak_bytes, plain.peak_bytes * 3 / 4) << costs.to_table();
  const remat::Budget budget = remat::Budget::bytes(selective.peak_bytes);
  const remat::PlanResult result =
      remat::plan_verified(costs, budget, remat::PlannerOptions(),
                           [&](const remat::Plan& p) { return remat::measure_plan_peak(chain, p, x); });
  ASSERT_TRUE(result.feasible) << costs.to_table();
  EXPECT_NE(result.plan.to_string().find(":sac"), std::string::npos) << result.plan.to_string() << "\n"
                                                                     << costs.to_table();
  EXPECT_LE(result.measured_peak_bytes, selective.peak_bytes);
}
