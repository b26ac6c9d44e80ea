#include "remat/models/gpt_planning.h"

#include "remat/error.h"
#include "remat/models/estimator.h"
#include "remat/models/gpt_policies.h"
#include "remat/profiler.h"

namespace remat::models {

Prediction GptCosts::predict(const Plan& plan) const { return simulate(to_half_granularity(plan), half); }

Prediction GptCosts::unchecked() const { return simulate(Plan::plain(GptChainShape(layers(), "half")), half); }

GptCosts profile_gpt(Gpt model, const at::Tensor& tokens, const at::Tensor& targets, int repeats, CheckpointMode mode) {
  GptChain chain(std::move(model), "half");
  chain.set_targets(targets);
  return GptCosts{profile_chain(chain, tokens, ProfileOptions().repeats(repeats).mode(mode))};
}

GptCosts gpt_costs_from_json(const std::string& text, const std::string& source) {
  GptCosts costs{CostTable::from_json(text, source)};
  REMAT_CHECK(costs.half.granularity == "half" && costs.half.stages.size() >= 4 && costs.half.stages.size() % 2 == 0,
              source, ": not a half-block cost table of a GPT (granularity 'half': embed, attention and MLP halves, head).");
  costs.half.validate_against(GptChainShape(costs.layers(), "half"));
  return costs;
}

void check_gpt_costs(const GptCosts& costs, const GptConfig& config, int64_t batch, const std::string& source) {
  REMAT_CHECK(costs.layers() == config.layers, source, ": describes a model with ", costs.layers(),
              " layers but GptConfig::layers is ", config.layers, ".");
  const int64_t boundary = batch * config.sequence * config.hidden * 4;  // fp32 (B,T,C)
  REMAT_CHECK(costs.half.stages.front().output_bytes == boundary, source,
              ": was made for another model or batch: its activations between stages are ",
              costs.half.stages.front().output_bytes, " bytes, but batch ", batch, " x GptConfig::sequence ",
              config.sequence, " x GptConfig::hidden ", config.hidden, " x 4 bytes = ", boundary,
              ". Profile this model and batch again.");
}

BudgetPlan gpt_plan_for_budget(const GptCosts& costs, const Budget& budget, int64_t memory_slots, CheckpointMode mode) {
  Plan plan_template = Plan::plain(GptChainShape(costs.layers(), "half"));
  plan_template.mode = mode;
  return plan_for_budget(costs.half, plan_template, budget, memory_slots);
}

std::vector<std::string> gpt_policy_names() {
  return {"block", "every:2", "every:4", "segments:2", "segments:4", "sqrt", "ffn", "attn", "ffn+attn", "selective",
          "matmul-inputs", "fused", "fused+matmul-inputs"};
}

std::vector<std::string> gpt_policy_candidates() { return with_and_without_skip_ends(gpt_policy_names()); }

std::vector<PlanCandidate> gpt_compare_planners(const GptCosts& costs, int64_t budget_bytes, int64_t memory_slots) {
  const int64_t layers = costs.layers();
  return compare_planners(
      costs.half, Plan::plain(GptChainShape(layers, "half")), budget_bytes, gpt_policy_candidates(),
      [layers](const std::string& policy) {
        return gpt_policy_plan(policy, GptChainShape(layers, gpt_policy_granularity(policy)));
      },
      [&costs](const Plan& plan) { return costs.predict(plan); }, memory_slots);
}

}  // namespace remat::models
