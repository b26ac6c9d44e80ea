// Is a prediction as good as each stage's time? The fused plan's step time relative to the plain
// one's, predicted from a profile and measured in interleaved rounds (paired), on a small GPT whose
// stages take milliseconds. The ratio cancels the machine's load level; a stage timed several
// times off shows as a gap of tens of points (the fused stages on LibTorch 2.6 were once predicted
// at -84% against a measured -12%). Prints the figures of each attempt; asserts nothing (timings
// on shared cores are benchmarks, not tests).
//
//   remat_prediction_bench [attempts (3)] [measured rounds (7)]
#include <cstdio>
#include <string>

#include <torch/torch.h>

#include "remat/planning/cost_model.h"
#include "remat/models/gpt.h"
#include "remat/models/gpt_policies.h"
#include "remat/measure/plan_measurement.h"
#include "remat/measure/profiler.h"

int main(int argc, char** argv) {
  const int attempts = argc > 1 ? std::stoi(argv[1]) : 3;
  const int rounds = argc > 2 ? std::stoi(argv[2]) : 7;
  remat::models::GptConfig config;
  config.layers(3).hidden(128).heads(4).sequence(128);
  torch::manual_seed(0);
  remat::models::GptChain blocks(remat::models::Gpt(config),
                                 remat::models::GptGranularity::block);  // where the fused policy applies
  const at::Tensor tokens = torch::randint(0, 256, {4, 128}, torch::kLong);
  blocks.set_targets(torch::randint(0, 256, {4, 128}, torch::kLong));
  const std::vector<remat::Plan> plans = {remat::Plan::unchecked(blocks),
                                          remat::models::gpt_policy_plan("fused", blocks)};
  std::printf("GPT %s, batch 4: the fused plan's step time over the plain one's\n", config.describe().c_str());
  std::printf("%-8s %-10s %-10s %s\n", "attempt", "predicted", "measured", "gap (points)");
  for (int attempt = 1; attempt <= attempts; ++attempt) {
    const remat::CostTable costs = remat::profile_chain(blocks, tokens, remat::ProfileOptions().repeats(3));
    const auto measured = remat::measure_plans(blocks, plans, tokens, rounds);
    const double predicted =
        remat::simulate(plans[1], costs).step_seconds / remat::simulate(plans[0], costs).step_seconds;
    const double actual = remat::paired_time_ratio(measured[1], measured[0]);
    std::printf("%-8d %-10.3f %-10.3f %+.1f\n", attempt, predicted, actual, 100 * (predicted - actual));
  }
  return 0;
}
