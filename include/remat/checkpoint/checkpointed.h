// remat/checkpoint/checkpointed.h — checkpointing whole modules.
//
//   remat::Checkpointed block(MyBlock(256));            // block's forward is now checkpointed
//   block->set_enabled(false);                           // ... or not, switchable at run time
//   auto y = remat::checkpoint_sequential(seq, 4, x);    // PyTorch's checkpoint_sequential
//
// `Checkpointed` exposes the wrapped module's parameters, buffers and submodules under their own
// names, so state saved from the plain module loads into the wrapped one and back. Its buffers
// (BatchNorm running statistics) are restored after each recompute: they update once per step.
#pragma once

#include <cstdint>
#include <ostream>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include "remat/checkpoint/checkpoint.h"

namespace remat {

/// A module whose `forward(Tensor)` runs under `checkpoint` while enabled.
class CheckpointedImpl : public torch::nn::Module {
 public:
  /// Wraps any module (or module holder) with `forward(Tensor) -> Tensor`.
  template <typename ModuleType>
  explicit CheckpointedImpl(ModuleType module, CheckpointOptions options = {})
      : CheckpointedImpl(torch::nn::AnyModule(std::move(module)), std::move(options)) {}
  CheckpointedImpl(torch::nn::AnyModule module, CheckpointOptions options);
  /// Wraps a Sequential (whose templated forward AnyModule cannot hold).
  explicit CheckpointedImpl(torch::nn::Sequential sequential, CheckpointOptions options = {});

  at::Tensor forward(const at::Tensor& input);

  /// Off: the wrapped module runs plainly and keeps its activations.
  void set_enabled(bool enabled) { enabled_ = enabled; }
  bool enabled() const { return enabled_; }

  /// The wrapped module.
  std::shared_ptr<torch::nn::Module> wrapped() const { return module_; }

  void train(bool on = true) override;
  void pretty_print(std::ostream& stream) const override;

 private:
  CheckpointedImpl(std::shared_ptr<torch::nn::Module> module, TensorFunction forward, CheckpointOptions options);

  std::shared_ptr<torch::nn::Module> module_;
  TensorFunction forward_;
  CheckpointOptions options_;
  bool enabled_ = true;
};

TORCH_MODULE(Checkpointed);

/// PyTorch's checkpoint_sequential rule, shared by checkpoint_sequential and the `segments:K`
/// policy (chain/policies.h): the [begin, end) ranges of the checkpointed segments when `items`
/// items are cut into `segments` (1 to `items`): ⌊items/segments⌋ items each, the first
/// segments−1 of them; the rest runs plainly.
std::vector<std::pair<int64_t, int64_t>> checkpoint_sequential_segments(int64_t items, int64_t segments);

/// Runs `sequential` on `input` in `segments` parts of ⌊n/segments⌋ modules, the first
/// segments−1 checkpointed and the rest run plainly, as PyTorch's `checkpoint_sequential`.
/// `segments` must be in [1, n]; 1 checkpoints nothing. (The rule: checkpoint_sequential_segments,
/// policies.h, which the `segments:K` policy shares.)
at::Tensor checkpoint_sequential(const torch::nn::Sequential& sequential, int64_t segments, const at::Tensor& input,
                                 const CheckpointOptions& options = {});

}  // namespace remat
