// The GPT's checkpointing policies: the generic ones (remat/chain/policies.h) over its blocks, and those
// that need its anatomy — attention and MLP halves, and what a block keeps inside.
//
//   none  block  every:K  segments:K  sqrt           (generic, on whole blocks)
//   ffn  attn  ffn+attn                              (half-blocks: GptGranularity::half)
//   core-attn  matmul-inputs                         (stage options, no segments)
//   and any of them with ",skip-ends"
#pragma once

#include <string>
#include <vector>

#include "remat/chain/policies.h"
#include "remat/models/gpt_granularity.h"

namespace remat::models {

/// Every policy the GPT offers, generic ones first, in the order `remat policies` lists them.
std::vector<PolicyDescription> gpt_policy_descriptions();

/// The GPT chain granularity that `policy` needs; throws for unknown policies.
GptGranularity gpt_policy_granularity(const std::string& policy);

/// Builds the plan of `policy` for a GPT chain (GptChain or GptChainShape) of the granularity above.
Plan gpt_policy_plan(const std::string& policy, const Chain& chain);

/// The plan of `policy` for a GPT of `layers` layers, on the chain of the policy's granularity.
Plan gpt_policy_plan(const std::string& policy, int64_t layers);

}  // namespace remat::models
