// remat/chain/policies.h — the field's rules of thumb as plan builders, for any chain.
//
//   none  block  every:K  segments:K  sqrt   and any of them with ",skip-ends"
//
// They checkpoint whole blocks (StageInfo::block): every block, runs of K blocks, PyTorch's
// checkpoint_sequential over the blocks, or ceil(sqrt(N)) segments; ",skip-ends" leaves the first
// and last blocks unchecked. A model may add policies of its own on top (remat's example
// models do, in models/).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "remat/chain/plan.h"

namespace remat {

struct PolicyDescription {
  std::string name;      ///< how it is written, e.g. "every:K"
  std::string tradeoff;  ///< one line: what it keeps, what it costs
};

/// The generic policies, in the order they are documented.
std::vector<PolicyDescription> policy_descriptions();

/// True when `policy` names a generic policy (well formed or not: "every:x" is one, badly written).
bool is_generic_policy(const std::string& policy);
/// Throws for a policy spelled by another name of the unchecked plan ("plain", "unchecked",
/// "no-checkpoint"), naming the one it has: "none". Every policy parser calls it first.
void refuse_other_names_of_none(const std::string& policy);

/// Throws a clear error unless `policy` is a well-formed generic policy ("every:0" is not).
void check_policy(const std::string& policy);

/// Builds the plan of a generic `policy` for `chain`; throws a clear error for unknown policies,
/// malformed numbers and chains without blocks.
Plan policy_plan(const std::string& policy, const Chain& chain);

/// The generic policies the planners compare with (compare_planners, the measured choice), one
/// list: block, every:2, every:3, every:4, segments:2, segments:4, sqrt, sac. A model with its own
/// sub-block policies extends it.
std::vector<std::string> generic_policy_names();

/// generic_policy_names(), each with and without ",skip-ends".
std::vector<std::string> generic_policy_candidates();

/// Each policy, then the same with ",skip-ends".
std::vector<std::string> with_and_without_skip_ends(const std::vector<std::string>& policies);

/// Splits ",skip-ends" off `policy`: returns the base and sets `skip_ends`.
std::string split_skip_ends(const std::string& policy, bool& skip_ends);

/// The blocks a policy may touch, [first, last): all, or all but the first and the last.
std::pair<int64_t, int64_t> policy_block_range(int64_t blocks, bool skip_ends);

/// The plan running `chain` plainly except that each range [begin, end) of stages in `segments`
/// (in order, disjoint) is one checkpointed segment.
Plan plan_with_segments(const Chain& chain, const std::vector<std::pair<int64_t, int64_t>>& segments);

}  // namespace remat
