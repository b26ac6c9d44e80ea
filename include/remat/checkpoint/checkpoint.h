// remat/checkpoint/checkpoint.h — activation checkpointing for a function of tensors.
//
//   auto y = remat::checkpoint([block](const torch::Tensor& x) { return block->forward(x); }, x);
//
// `fn` is kept until backward, which calls it again: it must own what it captures (module holders
// and tensors by value; a `[&]` capture of a caller's locals dangles once the caller returns).
// Forward runs `fn` without keeping its intermediate activations: only its inputs are kept.
// Backward recomputes `fn` from them with grad enabled, under the RNG, autocast and grad-mode
// state of the forward, and back-propagates through the recomputed graph.
//
// Parameters used inside `fn` get their gradients (found by recording the forward's graph), a
// saved tensor changed in place before the recompute is refused with an error, a captured tensor
// changed or rebound after the forward is refused (check_reads, on by default), and under
// torch::NoGradGuard `fn` is just called. Two modes (CheckpointMode): reentrant, one autograd node
// recomputing `fn` whole; non_reentrant, saved-tensor hooks and a recompute that stops early.
// How each works and what it promises: docs/design.md, "The checkpoint mechanism".
#pragma once

#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/arg.h>

#include "remat/checkpoint/selective.h"

namespace remat {

enum class CheckpointMode { reentrant, non_reentrant };

/// "reentrant" or "non-reentrant", as plans and reports spell it.
const char* to_string(CheckpointMode mode);
/// The inverse of to_string; a clear error for anything else.
CheckpointMode parse_checkpoint_mode(const std::string& text);
/// Writes to_string(mode).
std::ostream& operator<<(std::ostream& out, CheckpointMode mode);

/// The mode of checkpoint calls whose options name none (reentrant unless a CheckpointModeGuard
/// says otherwise on this thread).
CheckpointMode default_checkpoint_mode();

/// Sets the default mode on this thread while alive (e.g. for a whole model of Checkpointed
/// modules): `remat::CheckpointModeGuard mode(remat::CheckpointMode::non_reentrant);`
class CheckpointModeGuard {
 public:
  explicit CheckpointModeGuard(CheckpointMode mode);
  ~CheckpointModeGuard();
  CheckpointModeGuard(const CheckpointModeGuard&) = delete;
  CheckpointModeGuard& operator=(const CheckpointModeGuard&) = delete;

 private:
  CheckpointMode previous_;
};

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
  /// The mode; none: default_checkpoint_mode().
  TORCH_ARG(c10::optional<CheckpointMode>, mode) = c10::nullopt;
  /// Selective checkpointing (remat/checkpoint/selective.h): per operator call of the forward, keep its
  /// results or recompute them. None (the default): only the inputs are kept.
  TORCH_ARG(SelectivePolicy, selective) = nullptr;
  /// As the recompute reaches each operator call, check that the tensors it reads from outside the
  /// function (captured tensors, parameters) are the ones the forward's call read, unchanged: a
  /// captured `w` changed in place (`w.add_(1)`) or rebound (`w = w + 1`) after the forward is
  /// refused, naming the operator, where no version counter sees it; so is a function that changes
  /// such a tensor in place and then reads it. Tensors from outside that the function only writes
  /// (running statistics) are restored after each recompute, as restore_after_recompute does.
  /// Costs an interception of every operator call inside the checkpoint (well under a microsecond);
  /// on by default (none: on).
  TORCH_ARG(c10::optional<bool>, check_reads) = c10::nullopt;

 public:
  /// PyTorch's name (torch.utils.checkpoint's use_reentrant): mode(on ? reentrant : non_reentrant).
  CheckpointOptions& use_reentrant(bool on) {
    mode_ = on ? CheckpointMode::reentrant : CheckpointMode::non_reentrant;
    return *this;
  }
  /// mode(), or the thread's default where none is set.
  CheckpointMode effective_mode() const { return mode_.value_or(default_checkpoint_mode()); }
  /// check_reads(), or its default: on.
  bool effective_check_reads() const { return check_reads_.value_or(true); }
};

using TensorFunction = std::function<at::Tensor(const at::Tensor&)>;
using TensorListFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

/// Checkpoints a function of several tensors returning several tensors. Inputs may be undefined
/// or not require grad; outputs may be integer (non-differentiable), undefined or unused.
std::vector<at::Tensor> checkpoint(const TensorListFunction& fn, const std::vector<at::Tensor>& inputs,
                                   const CheckpointOptions& options = {});

/// Checkpoints a function of one tensor returning one tensor.
at::Tensor checkpoint(const TensorFunction& fn, const at::Tensor& input, const CheckpointOptions& options = {});

}  // namespace remat
