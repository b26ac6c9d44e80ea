// remat/chain/chain.h — a model seen as an ordered chain of stages, the unit plans are made of.
//
// Stage i maps the activation a(i-1) to a(i); the first stage takes the model's input, the last
// returns its output (a loss, when the chain ends in one). Boundaries lie where one tensor carries
// everything forward (a residual stream, a Sequential's module outputs), so keeping a(i) is all a
// recompute from stage i+1 needs. Each stage lists the options it offers for what it keeps inside;
// the names are the chain's own, and options[0] is the stage's default. Every stage of every chain
// also accepts the generic option "sac" (kSacOption): its default option run as a checkpoint
// under the compute-intensive selective policy (remat/checkpoint/selective.h), which the profiler measures and
// the planner chooses like any other where ProfileOptions::sac_option asks for it.
// `SequentialChain` (sequential_chain.h) makes any torch::nn::Sequential a chain.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace remat {

/// The option every stage of every chain accepts besides its own: the stage's default option run as
/// a non-reentrant checkpoint under save_compute_intensive() — its matrix products, convolutions and
/// attention kept, its norms, activations, softmax and dropout recomputed in its backward. A stage
/// that lists an option of this name itself runs its own.
inline const char* const kSacOption = "sac";

struct StageInfo {
  std::string name;  ///< unique in the chain, e.g. "conv3" or "layer11"
  /// The block it belongs to, for policies that checkpoint whole blocks ("every:2"): consecutive
  /// stages with one index form a block; -1 for stages outside any block (an input embedding, a loss).
  int64_t block = -1;
  std::vector<std::string> options;  ///< what it can keep; options[0] is the default
};

class Chain {
 public:
  virtual ~Chain() = default;
  /// Expires when this chain object is destroyed (a copy has its own): a checkpointed segment's
  /// recompute, which runs in backward, checks it before calling the chain (run_plan).
  std::weak_ptr<const void> lifetime() const { return alive_; }
  /// The stages, in order.
  virtual const std::vector<StageInfo>& stages() const = 0;
  /// How the chain cuts its model into stages, in the chain's own words; plans record it.
  virtual std::string granularity() const = 0;
  /// Runs stage `index` on `input` with `option` (one of the stage's options).
  virtual at::Tensor forward_stage(int64_t index, const at::Tensor& input, const std::string& option) = 0;
  /// Runs stage `index` as the last stage of a segment that a checkpoint's backward recomputes:
  /// the returned tensor is never read, only its autograd graph (with what that graph saves). A
  /// stage ending in operations whose backward needs only their inputs (a linear layer, dropout,
  /// a residual add) may skip computing them and return a tensor of the right shape whose graph
  /// gives the same gradients: an early stop, as PyTorch's non-reentrant checkpoint makes. The
  /// default runs forward_stage.
  virtual at::Tensor forward_stage_graph_only(int64_t index, const at::Tensor& input, const std::string& option) {
    return forward_stage(index, input, option);
  }
  /// The parameters stage `index` uses (their gradients are held together at the end of a
  /// checkpointed segment's backward). Empty when unknown.
  virtual std::vector<at::Tensor> stage_parameters(int64_t /*index*/) const { return {}; }
  /// Names of stage_parameters(index), in the same order, for reports; empty when unknown.
  virtual std::vector<std::string> stage_parameter_names(int64_t /*index*/) const { return {}; }
  /// What stage `index` computes, as a key: stages with the same non-empty signature run the same
  /// operations on parameters of the same shapes (twelve identical Transformer layers). The profiler
  /// then takes one time for all of them, the median of theirs: otherwise timing noise makes some
  /// look cheaper to recompute than their twins, and a planner choosing them is fooled by the noise.
  /// Empty (the default): the stage is timed on its own.
  virtual std::string stage_signature(int64_t /*index*/) const { return {}; }
  /// Tensors stage `index` updates in place as a side effect of its forward (BatchNorm running
  /// statistics): a recompute restores them, so they update once per step under every plan.
  virtual std::vector<at::Tensor> stage_buffers(int64_t /*index*/) const { return {}; }

  int64_t size() const { return static_cast<int64_t>(stages().size()); }
  /// The options stage `index` accepts: its own (StageInfo::options), then kSacOption unless
  /// it lists that itself.
  std::vector<std::string> accepted_options(int64_t index) const;
  /// Runs stage `index` with any accepted option: the chain's own through forward_stage (or
  /// forward_stage_graph_only), kSacOption generically, as a selective checkpoint whose recompute
  /// runs in backward: it holds `owner` (the chain's owner, where the caller has one) until then, and
  /// is a clear error if the chain is gone by then.
  at::Tensor run_stage(int64_t index, const at::Tensor& input, const std::string& option, bool graph_only = false,
                       const std::shared_ptr<const void>& owner = nullptr);
  /// Number of blocks (the largest block index + 1).
  int64_t num_blocks() const;

 protected:
  Chain() = default;
  Chain(const Chain& /*other*/) {}  // a new object, a new lifetime
  Chain& operator=(const Chain& /*other*/) { return *this; }

 private:
  std::shared_ptr<const char> alive_ = std::make_shared<const char>('\0');
};

}  // namespace remat
