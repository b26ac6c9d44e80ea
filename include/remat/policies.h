// remat/policies.h — the field's rules of thumb as plan builders.
//
//   none  block  every:K  segments:K  sqrt  ffn  attn  ffn+attn  selective  matmul-inputs
//   and any of them with ",skip-ends" (first and last blocks exempt)
//
// A policy first says which granularity of chain it needs (whole blocks or half-blocks), then
// builds a plan for such a chain. `remat policies` prints each with its trade-off.
#pragma once

#include <string>
#include <vector>

#include "remat/plan.h"

namespace remat {

struct PolicyDescription {
  std::string name;      ///< as written on the command line
  std::string tradeoff;  ///< one line: what it keeps, what it costs
};

/// Every policy, in the order `remat policies` lists them.
std::vector<PolicyDescription> policy_descriptions();

/// The chain granularity ("block" or "half") that `policy` needs; throws for unknown policies.
std::string policy_granularity(const std::string& policy);

/// Builds the plan of `policy` for `chain` (of the granularity above).
Plan policy_plan(const std::string& policy, const Chain& chain);

}  // namespace remat
