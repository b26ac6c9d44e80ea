// remat/checkpoint/checkpoint.h — activation checkpointing for a function of tensors.
//
//   auto y = remat::checkpoint(block, x);  // a module holder: kept alive until backward
//   auto z = remat::checkpoint([block](const torch::Tensor& x) { return block->forward(x); }, x);
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
// torch::NoGradGuard `fn` is just called. Two modes (CheckpointMode): non_reentrant (the default, as
// PyTorch recommends), saved-tensor hooks and a recompute that stops early, gradients bit for bit the
// unchecked run's; reentrant, one autograd node recomputing `fn` whole, whose gradient of an input
// also used outside `fn` is summed in another order (off by float rounding).
// How each works and what it promises: docs/design.md, "The checkpoint mechanism".
#pragma once

#include <functional>
#include <iosfwd>
#include <string>
#include <type_traits>
#include <utility>
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

/// The mode of checkpoint calls whose options name none (non-reentrant unless a CheckpointModeGuard
/// says otherwise on this thread).
CheckpointMode default_checkpoint_mode();

/// Sets the default mode on this thread while alive (e.g. for a whole model of Checkpointed
/// modules): `remat::CheckpointModeGuard mode(remat::CheckpointMode::reentrant);`
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

namespace detail {
std::vector<at::Tensor> checkpoint_function(const TensorListFunction& fn, const std::vector<at::Tensor>& inputs,
                                            const CheckpointOptions& options);
at::Tensor checkpoint_function(const TensorFunction& fn, const at::Tensor& input, const CheckpointOptions& options);

// A module holder (torch::nn::Linear, a TORCH_MODULE of your own) names its module type. It is
// told apart before std::function is asked whether it can hold it: that question instantiates the
// holder's operator() with the wrong arguments, a hard error rather than a failed overload.
template <typename T, typename = void>
struct is_module_holder : std::false_type {};
template <typename T>
struct is_module_holder<T, std::void_t<typename T::ContainedType>> : std::true_type {};

template <typename Fn, typename Function>
using if_function = std::enable_if_t<
    std::conjunction<std::negation<is_module_holder<std::decay_t<Fn>>>, std::is_constructible<Function, Fn>>::value,
    int>;
template <typename Holder>
using if_module_holder = std::enable_if_t<is_module_holder<std::decay_t<Holder>>::value, int>;
}  // namespace detail

/// Checkpoints a function of several tensors returning several tensors. Inputs may be undefined
/// or not require grad; outputs may be integer (non-differentiable), undefined or unused.
template <typename Fn, detail::if_function<Fn, TensorListFunction> = 0>
std::vector<at::Tensor> checkpoint(Fn&& fn, const std::vector<at::Tensor>& inputs,
                                   const CheckpointOptions& options = {}) {
  return detail::checkpoint_function(TensorListFunction(std::forward<Fn>(fn)), inputs, options);
}

/// Checkpoints a function of one tensor returning one tensor.
template <typename Fn, detail::if_function<Fn, TensorFunction> = 0>
at::Tensor checkpoint(Fn&& fn, const at::Tensor& input, const CheckpointOptions& options = {}) {
  return detail::checkpoint_function(TensorFunction(std::forward<Fn>(fn)), input, options);
}

/// Checkpoints a module's forward of one tensor: `remat::checkpoint(block, x)`. The holder is
/// copied into the checkpoint, so the module lives until backward; its buffers (BatchNorm's running
/// statistics) are updated once, by the forward, also with check_reads(false).
template <typename Holder, detail::if_module_holder<Holder> = 0>
at::Tensor checkpoint(const Holder& module, const at::Tensor& input, const CheckpointOptions& options = {}) {
  std::decay_t<Holder> owned = module;
  CheckpointOptions module_options = options;
  if (owned->is_training()) {
    std::vector<at::Tensor> restored = options.restore_after_recompute();
    for (const auto& buffer : owned->buffers()) restored.push_back(buffer);
    module_options.restore_after_recompute(std::move(restored));
  }
  return detail::checkpoint_function(
      TensorFunction([owned](const at::Tensor& x) mutable -> at::Tensor { return owned->forward(x); }), input,
      module_options);
}

}  // namespace remat
