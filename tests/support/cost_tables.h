// Test helpers: cost tables built in code (random, with blocks, or of equal stages), the plan that
// runs a table's stages plainly, and every nested plan in the planner's space.
#pragma once

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "remat/chain/plan.h"
#include "remat/checkpoint/checkpoint.h"
#include "remat/planning/cost_model.h"

namespace remat::testing {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// A chain of n stages with random integer sizes and times; stage i offers `options` options.
inline CostTable random_chain(std::mt19937& rng, int n, int max_options) {
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  CostTable t;
  t.granularity = "test";
  t.segment_bytes = uniform(0, 2);
  t.segment_forward_seconds = uniform(0, 2);  // charged once per segment, by the program as by the simulator
  t.segment_backward_seconds = uniform(0, 1);
  for (int i = 0; i < n; ++i) {
    remat::StageCost s;
    s.name = "s" + std::to_string(i);
    s.output_bytes = uniform(1, 5);
    s.input_grad_bytes = i == 0 ? 0 : t.stages[i - 1].output_bytes;
    s.nograd_seconds = uniform(1, 4);
    s.nograd_extra_bytes = uniform(0, 3);
    s.parameter_bytes = uniform(0, 2);
    s.recompute_extra_seconds = uniform(0, 2);  // charged per recompute, by the program as by the simulator
    const int options = uniform(1, max_options);
    for (int o = 0; o < options; ++o) {
      remat::StageOptionCost c;
      c.option = "o" + std::to_string(o);
      c.forward_seconds = uniform(1, 5);
      c.backward_seconds = uniform(1, 8);
      c.kept_bytes = s.output_bytes + uniform(0, 6);
      c.forward_extra_bytes = uniform(0, 3);
      c.backward_extra_bytes = uniform(0, 4);
      if (uniform(0, 1) == 1) {  // graph-only as a segment's last stage: cheaper, output not kept
        remat::StageRunCost g = c;
        g.forward_seconds = uniform(0, static_cast<int>(c.forward_seconds));
        g.kept_bytes = c.kept_bytes - s.output_bytes + uniform(0, 1);
        g.forward_extra_bytes = uniform(0, 3);
        g.backward_extra_bytes = uniform(0, 4);
        c.graph_only = g;
      }
      s.options.push_back(c);
    }
    t.stages.push_back(s);
  }
  return t;
}

inline Plan template_for(const CostTable& t, remat::CheckpointMode mode = remat::CheckpointMode::reentrant) {
  Plan p;
  p.granularity = t.granularity;
  p.mode = mode;
  for (const auto& s : t.stages) {
    p.stage_names.push_back(s.name);
    p.options.push_back(s.options.front().option);
  }
  return p;
}

// Every nested plan over stages [s, t] in the planner's space (a segment never ends at the end of
// its enclosing range), as item lists.
inline std::vector<std::vector<PlanItem>> all_item_lists(int s, int t) {
  std::vector<std::vector<PlanItem>> out;
  if (s > t) return {{}};
  for (auto& rest : all_item_lists(s + 1, t)) {  // run s
    std::vector<PlanItem> items{PlanItem::run(s)};
    items.insert(items.end(), rest.begin(), rest.end());
    out.push_back(items);
  }
  for (int j = s + 1; j <= t; ++j) {  // checkpoint s..j-1
    for (auto& inner : all_item_lists(s, j - 1)) {
      for (auto& rest : all_item_lists(j, t)) {
        std::vector<PlanItem> items{PlanItem::checkpointed(inner)};
        items.insert(items.end(), rest.begin(), rest.end());
        out.push_back(items);
      }
    }
  }
  return out;
}

// n stages; stages [first_block, last_block] in blocks 0, 1, ...; the rest outside any block.
inline CostTable chain_with_blocks(int n, int first_block, int last_block) {
  std::mt19937 rng(21);
  CostTable t = random_chain(rng, n, 1);
  for (int i = 0; i < n; ++i) t.stages[i].block = i >= first_block && i <= last_block ? i - first_block : -1;
  return t;
}

// `n` equal stages of 0.1 ms forward, 0.2 ms backward, 100-byte outputs, keeping 300 bytes.
inline remat::CostTable equal_stages(int n) {
  remat::CostTable costs;
  costs.granularity = "test";
  for (int i = 0; i < n; ++i) {
    remat::StageCost s;
    s.name = "s" + std::to_string(i);
    s.output_bytes = 100;
    s.input_grad_bytes = i == 0 ? 0 : 100;
    s.nograd_seconds = 1e-4;
    s.options.emplace_back("full", 1e-4, 2e-4, 300, 0, 0);
    costs.stages.push_back(s);
  }
  return costs;
}

}  // namespace remat::testing
