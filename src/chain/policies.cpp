#include "remat/chain/policies.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "remat/base/error.h"
#include "remat/checkpoint/checkpointed.h"

namespace remat {
namespace {

struct PolicySpec {
  std::string base;  // "block", "every", ...
  int64_t k = 0;     // for every:K and segments:K
  bool skip_ends = false;
};

const std::vector<PolicyDescription>& descriptions() {
  static const std::vector<PolicyDescription> list = {
      {"none", "keep every activation: most memory, no recompute"},
      {"block", "checkpoint every block: keeps only block inputs, recomputes every block's forward once"},
      {"every:K",
       "checkpoint runs of K blocks: keeps one boundary per K blocks, recomputes all blocks; peak grows with K"},
      {"segments:K", "PyTorch's checkpoint_sequential over the blocks: K segments, the last one not checkpointed"},
      {"sqrt", "ceil(sqrt(N)) checkpointed segments (Chen et al.): O(sqrt N) boundaries for one extra forward"},
      {"sac",
       "selective checkpointing in every block (stage option sac): keeps matrix products, convolutions and "
       "attention, recomputes norms, activations, softmax and dropout"},
      {"<policy>,skip-ends", "any policy with the first and last blocks left unchecked (they run plainly)"},
  };
  return list;
}

const std::set<std::string>& generic_bases() {
  static const std::set<std::string> bases = {"none", "block", "every", "segments", "sqrt", "sac"};
  return bases;
}

PolicySpec parse(const std::string& policy) {
  PolicySpec spec;
  const std::string text = split_skip_ends(policy, spec.skip_ends);
  auto colon = text.find(':');
  spec.base = text.substr(0, colon);
  refuse_other_names_of_none(policy);
  if (generic_bases().count(spec.base) == 0) {
    std::string names;
    for (const auto& d : descriptions()) names += (names.empty() ? "" : ", ") + d.name;
    REMAT_CHECK(false, "unknown policy '", policy, "'. Known policies: ", names, ".");
  }
  if (colon != std::string::npos) {
    const std::string number = text.substr(colon + 1);
    REMAT_CHECK(spec.base == "every" || spec.base == "segments", "policy '", policy,
                "': only every:K and segments:K take a number.");
    size_t used = 0;
    try {
      spec.k = std::stoll(number, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    REMAT_CHECK(used == number.size() && !number.empty() && spec.k >= 1, "policy '", policy,
                "': K must be a whole number >= 1, as in ", spec.base, ":2.");
  } else {
    REMAT_CHECK(spec.base != "every" && spec.base != "segments", "policy '", policy, "' needs a number: ", spec.base,
                ":K.");
  }
  return spec;
}

// Stage ranges [begin, end) of each block, in order.
std::vector<std::pair<int64_t, int64_t>> block_ranges(const Chain& chain) {
  std::vector<std::pair<int64_t, int64_t>> ranges(chain.num_blocks(), {-1, -1});
  for (int64_t i = 0; i < chain.size(); ++i) {
    const int64_t b = chain.stages()[i].block;
    if (b < 0) continue;
    if (ranges[b].first < 0) ranges[b].first = i;
    ranges[b].second = i + 1;
  }
  return ranges;
}

}  // namespace

std::vector<PolicyDescription> policy_descriptions() { return descriptions(); }

void check_policy(const std::string& policy) { parse(policy); }

std::vector<std::string> generic_policy_names() {
  return {"block", "every:2", "every:3", "every:4", "segments:2", "segments:4", "sqrt", "sac"};
}

std::vector<std::string> generic_policy_candidates() { return with_and_without_skip_ends(generic_policy_names()); }

std::vector<std::string> with_and_without_skip_ends(const std::vector<std::string>& policies) {
  std::vector<std::string> out;
  for (const auto& policy : policies) {
    out.push_back(policy);
    out.push_back(policy + ",skip-ends");
  }
  return out;
}

std::string split_skip_ends(const std::string& policy, bool& skip_ends) {
  const std::string modifier = ",skip-ends";
  skip_ends = policy.size() > modifier.size() &&
              policy.compare(policy.size() - modifier.size(), modifier.size(), modifier) == 0;
  return skip_ends ? policy.substr(0, policy.size() - modifier.size()) : policy;
}

void refuse_other_names_of_none(const std::string& policy) {
  bool skip_ends = false;
  const std::string base = split_skip_ends(policy, skip_ends);
  // The unchecked plan has one name, as a policy: other words for it are refused, naming it.
  for (const char* other : {"plain", "unchecked", "no-checkpoint", "nocheckpoint", "no_checkpoint"}) {
    REMAT_CHECK(base != other, "unknown policy '", policy,
                "': the plan that checkpoints nothing is the policy 'none'.");
  }
}

bool is_generic_policy(const std::string& policy) {
  bool skip_ends = false;
  const std::string text = split_skip_ends(policy, skip_ends);
  return generic_bases().count(text.substr(0, text.find(':'))) > 0;
}

std::pair<int64_t, int64_t> policy_block_range(int64_t blocks, bool skip_ends) {
  const int64_t first = skip_ends ? std::min<int64_t>(1, blocks) : 0;
  const int64_t last = skip_ends ? std::max<int64_t>(first, blocks - 1) : blocks;  // exclusive
  return {first, last};
}

Plan plan_with_segments(const Chain& chain, const std::vector<std::pair<int64_t, int64_t>>& segments) {
  Plan plan = Plan::unchecked(chain);
  std::vector<PlanItem> items;
  size_t next_segment = 0;
  for (int64_t i = 0; i < chain.size();) {
    if (next_segment < segments.size() && segments[next_segment].first == i) {
      std::vector<PlanItem> inner;
      for (int64_t s = segments[next_segment].first; s < segments[next_segment].second; ++s)
        inner.push_back(PlanItem::run(s));
      i = segments[next_segment].second;
      ++next_segment;
      items.push_back(PlanItem::checkpointed(std::move(inner)));
    } else {
      items.push_back(PlanItem::run(i++));
    }
  }
  plan.items = std::move(items);
  return plan;
}

Plan policy_plan(const std::string& policy, const Chain& chain) {
  const PolicySpec spec = parse(policy);
  const auto blocks = block_ranges(chain);
  const auto n = static_cast<int64_t>(blocks.size());
  REMAT_CHECK(n > 0 || spec.base == "none", "policy '", policy, "' checkpoints blocks, but no stage of this chain ",
              "belongs to a block (StageInfo::block is -1 everywhere).");
  const auto [first, last] = policy_block_range(n, spec.skip_ends);
  const int64_t candidates = last - first;

  // Stage ranges to checkpoint, each as one segment.
  std::vector<std::pair<int64_t, int64_t>> segments;
  auto blocks_segment = [&](int64_t b0, int64_t b1) { segments.emplace_back(blocks[b0].first, blocks[b1 - 1].second); };
  if (spec.base == "block") {
    for (int64_t b = first; b < last; ++b) blocks_segment(b, b + 1);
  } else if (spec.base == "every") {
    for (int64_t b = first; b < last; b += spec.k) blocks_segment(b, std::min(b + spec.k, last));
  } else if (spec.base == "segments") {
    REMAT_CHECK(spec.k <= std::max<int64_t>(candidates, 1), "policy '", policy,
                "': K must be at most the number of blocks it ", "applies to (", candidates, ").");
    for (const auto& [b0, b1] : checkpoint_sequential_segments(candidates, spec.k))
      blocks_segment(first + b0, first + b1);
  } else if (spec.base == "sqrt" && candidates > 0) {
    const auto count = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(candidates))));
    const int64_t size = (candidates + count - 1) / count;
    for (int64_t b = first; b < last; b += size) blocks_segment(b, std::min(b + size, last));
  }
  Plan plan = plan_with_segments(chain, segments);
  if (spec.base == "sac") {
    for (int64_t b = first; b < last; ++b) {
      for (int64_t i = blocks[b].first; i < blocks[b].second; ++i) plan.options[i] = kSacOption;
    }
  }
  return plan;
}

}  // namespace remat
