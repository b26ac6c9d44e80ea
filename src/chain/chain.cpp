#include "remat/chain/chain.h"

#include <algorithm>

#include "remat/checkpoint/checkpoint.h"
#include "remat/base/error.h"
#include "remat/checkpoint/selective.h"

namespace remat {

int64_t Chain::num_blocks() const {
  int64_t n = 0;
  for (const auto& s : stages()) n = std::max(n, s.block + 1);
  return n;
}

std::vector<std::string> Chain::accepted_options(int64_t index) const {
  std::vector<std::string> options = stages().at(static_cast<size_t>(index)).options;
  if (std::find(options.begin(), options.end(), kSacOption) == options.end()) options.emplace_back(kSacOption);
  return options;
}

at::Tensor Chain::run_stage(int64_t index, const at::Tensor& input, const std::string& option, bool graph_only,
                            const std::shared_ptr<const void>& owner) {
  const StageInfo& info = stages().at(static_cast<size_t>(index));
  const bool own = std::find(info.options.begin(), info.options.end(), option) != info.options.end();
  if (own || option != kSacOption) {
    return graph_only ? forward_stage_graph_only(index, input, option) : forward_stage(index, input, option);
  }
  // One policy for every call: the preset's set of names is built once.
  static const SelectivePolicy policy = save_compute_intensive();
  const std::string default_option = info.options.at(0);
  std::weak_ptr<const void> alive = alive_;
  return checkpoint(
      [this, index, default_option, alive, owner, name = info.name](const at::Tensor& x) {
        // A chain made in a function that returns the loss is gone by backward: say so, rather
        // than call into freed memory.
        REMAT_CHECK(!alive.expired(), "the chain was destroyed before backward recomputed stage '", name, "' (option ",
                    kSacOption, "): keep the chain alive until backward has run, or give run_plan a ",
                    "std::shared_ptr to it, which it holds until then.");
        return forward_stage(index, x, default_option);
      },
      input,
      CheckpointOptions()
          .mode(CheckpointMode::non_reentrant)
          .selective(policy)
          .name(info.name)
          .restore_after_recompute(stage_buffers(index)));
}

}  // namespace remat
