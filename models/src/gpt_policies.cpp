#include "remat/models/gpt_policies.h"

#include <algorithm>

#include "remat/base/error.h"
#include "remat/models/estimator.h"
#include "remat/models/gpt.h"

namespace remat::models {
namespace {

// The half-block policies; the option policies (one per stage option but the default) come from
// the stage-option table (gpt.h).
const std::vector<PolicyDescription>& gpt_only_descriptions() {
  static const std::vector<PolicyDescription> list = [] {
    std::vector<PolicyDescription> out = {
        {"ffn", "checkpoint only the MLP halves: their 4h-wide activations go, attention's stay; recomputes the MLPs"},
        {"attn", "checkpoint only the attention halves: drops the s^2 attention maps, recomputes attention"},
        {"ffn+attn", "checkpoint each half-block separately: like block but keeps the mid-block residual too"}};
    for (const auto& o : keep_options()) {
      if (o.keep != Keep::full) out.push_back({o.name, o.tradeoff});
    }
    return out;
  }();
  return list;
}

bool is_half_policy(const std::string& base) { return base == "ffn" || base == "attn" || base == "ffn+attn"; }
bool is_option_policy(const std::string& base) {
  const auto& options = keep_options();
  return base != to_string(Keep::full) &&
         std::any_of(options.begin(), options.end(), [&](const KeepOption& o) { return base == o.name; });
}

// The policy without ",skip-ends" when it is one of the GPT's own; empty for generic ones. Throws
// for names neither knows, listing both.
std::string gpt_only_base(const std::string& policy, bool& skip_ends) {
  const std::string base = split_skip_ends(policy, skip_ends);
  refuse_other_names_of_none(policy);
  REMAT_CHECK(base != "selective", "unknown policy '", policy, "': the GPT's Megatron-style option policy is now ",
              "'core-attn'; 'selective' names per-operator checkpointing, the policy 'sac'.");
  if (is_half_policy(base) || is_option_policy(base)) return base;
  if (is_generic_policy(policy)) return "";
  std::string names;
  for (const auto& d : gpt_policy_descriptions()) names += (names.empty() ? "" : ", ") + d.name;
  REMAT_CHECK(false, "unknown policy '", policy, "'. Known policies: ", names, ".");
  return "";
}

}  // namespace

std::vector<PolicyDescription> gpt_policy_descriptions() {
  std::vector<PolicyDescription> list = policy_descriptions();
  const auto& own = gpt_only_descriptions();
  list.insert(list.end() - 1, own.begin(), own.end());  // ",skip-ends" stays last
  return list;
}

GptGranularity gpt_policy_granularity(const std::string& policy) {
  bool skip_ends = false;
  const std::string base = gpt_only_base(policy, skip_ends);
  if (base.empty()) check_policy(policy);
  return is_half_policy(base) ? GptGranularity::half : GptGranularity::block;
}

Plan gpt_policy_plan(const std::string& policy, int64_t layers) {
  return gpt_policy_plan(policy, GptChainShape(layers, gpt_policy_granularity(policy)));
}

Plan gpt_policy_plan(const std::string& policy, const Chain& chain) {
  const GptGranularity granularity = gpt_policy_granularity(policy);
  REMAT_CHECK(chain.granularity() == to_string(granularity), "policy '", policy, "' needs a GPT chain of granularity '",
              to_string(granularity), "', got '", chain.granularity(), "'.");
  bool skip_ends = false;
  const std::string base = gpt_only_base(policy, skip_ends);
  if (base.empty()) return policy_plan(policy, chain);

  const auto [first, last] = policy_block_range(chain.num_blocks(), skip_ends);
  std::vector<std::pair<int64_t, int64_t>> segments;
  std::vector<int64_t> option_stages;
  for (int64_t i = 0; i < chain.size(); ++i) {
    const auto& stage = chain.stages()[i];
    if (stage.block < first || stage.block >= last) continue;
    const GptStage kind = gpt_stage_kind(i, chain.size(), granularity);
    if (is_option_policy(base)) {
      option_stages.push_back(i);
    } else if ((kind == GptStage::mlp && base != "attn") || (kind == GptStage::attention && base != "ffn")) {
      segments.emplace_back(i, i + 1);
    }
  }
  Plan plan = plan_with_segments(chain, segments);
  // Stage options, not segments: every block stage keeps less inside.
  for (const int64_t i : option_stages) {
    const auto& options = chain.stages()[i].options;
    REMAT_CHECK(std::find(options.begin(), options.end(), base) != options.end(), "policy '", policy, "': stage '",
                chain.stages()[i].name, "' has no option '", base, "'.");
    plan.options[i] = base;
  }
  return plan;
}

}  // namespace remat::models
