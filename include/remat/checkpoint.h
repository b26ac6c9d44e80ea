// remat/checkpoint.h — activation checkpointing for a function of tensors.
//
//   auto y = remat::checkpoint([&](const torch::Tensor& x) { return block->forward(x); }, x);
//
// Forward runs `fn` without keeping its intermediate activations: only its inputs are kept.
// Backward recomputes `fn` from them with grad enabled, under the RNG, autocast and grad-mode
// state of the forward, and back-propagates through the recomputed graph.
//
// Unlike PyTorch's reentrant `torch.utils.checkpoint`, tensors that require grad and are used
// inside `fn` without being passed in `inputs` (a module's parameters) are found by recording the
// forward's graph (with its saved tensors dropped, so nothing is kept) and become inputs of the
// checkpoint's autograd node. Hence parameters get gradients even when no input requires grad,
// `torch::autograd::grad` works, and a parameter's hooks fire once per backward.
//
// Under `torch::NoGradGuard`, `checkpoint` just calls `fn`.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

namespace remat {

/// Options of one `checkpoint` call; chain the setters: `CheckpointOptions().name("block3")`.
struct CheckpointOptions {
  /// Restore the RNG state of the forward (CPU, and CUDA devices of the inputs) for the
  /// recompute, in a forked scope: dropout draws the same masks and the RNG stream after
  /// backward is the same as without checkpointing. Turn off only for RNG-free functions.
  TORCH_ARG(bool, preserve_rng_state) = true;
  /// Names the checkpointed function in error messages.
  TORCH_ARG(std::string, name) = "checkpoint";
  /// Tensors that `fn` updates in place as a side effect (BatchNorm running statistics): their
  /// values are restored after the recompute, so the update happens once, in the forward.
  /// `Checkpointed` and `checkpoint_sequential` pass their modules' buffers here themselves.
  TORCH_ARG(std::vector<at::Tensor>, restore_after_recompute) = {};
};

using TensorFunction = std::function<at::Tensor(const at::Tensor&)>;
using TensorListFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

/// Checkpoints a function of several tensors returning several tensors. Inputs may be undefined
/// or not require grad; outputs may be integer (non-differentiable), undefined or unused.
std::vector<at::Tensor> checkpoint(const TensorListFunction& fn,
                                   const std::vector<at::Tensor>& inputs,
                                   const CheckpointOptions& options = {});

/// Checkpoints a function of one tensor returning one tensor.
at::Tensor checkpoint(const TensorFunction& fn, const at::Tensor& input,
                      const CheckpointOptions& options = {});

}  // namespace remat
