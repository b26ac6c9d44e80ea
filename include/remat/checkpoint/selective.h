// remat/checkpoint/selective.h — selective checkpointing: inside a checkpointed function, a policy decides per
// operator call whether its results are kept from the forward or recomputed in backward.
//
//   auto options = remat::CheckpointOptions().selective(remat::save_compute_intensive());
//   at::Tensor y = remat::checkpoint(block_fn, x, options);  // matmul outputs kept, the rest recomputed
//
// The policy sees the operator calls as LibTorch's kernels receive them: below autograd and autocast,
// after decomposition (aten::addmm and aten::mm, not linear; aten::_softmax, not softmax). It is asked
// once per call of the forward; the recompute replays those answers: a kept call returns its kept
// results without running (the matrix product is not computed again), every other call runs again,
// and a non-reentrant recompute still stops as soon as the backward has what it needs. Vocabulary
// and presets follow PyTorch's selective activation checkpointing (torch.utils.checkpoint's
// CheckpointPolicy, torchtitan's "op" option); remat adds what PyTorch's leaves to the user:
//   - a kept result that the forward later changes in place (a linear's bias added in place to its
//     matrix product) is copied just before the change, so the recompute reads the value it had;
//   - a kept random call (any operator tagged nondeterministic_seeded: native_dropout, rand_like,
//     randn, randperm, ..., generator argument or not) restores the RNG streams to where the forward
//     left them, so every later random call recomputes the same draws;
//   - a call that writes an argument (schema alias annotations, plus the writes 1.13's schemas omit)
//     is never kept: under prefer_save it is recomputed, under must_save the forward stops with an
//     error naming it and the argument; a call that returns a view is recomputed under either;
//   - the policy runs as user code: its own tensor operations are not intercepted, a checkpoint
//     inside it is refused, its exceptions carry the call's name, other answers than the four are
//     refused;
//   - the recompute must make the same calls in the same order: a different operator is an error
//     naming both (data-dependent code).
// Outside a checkpoint nothing is intercepted; inside one, every call is unless check_reads(false) and no policy.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <c10/util/ArrayRef.h>

namespace c10 {
struct IValue;
}  // namespace c10

namespace remat {

/// What to do with one operator call's results (PyTorch's CheckpointPolicy). The must_/prefer_
/// pairs differ only where a call cannot be kept because it writes an argument: prefer_save then
/// recomputes it, must_save refuses. A view is recomputed under either. Both recompute policies
/// recompute.
enum class CheckpointPolicy { must_save, prefer_save, must_recompute, prefer_recompute };

/// "must_save", "prefer_save", "must_recompute" or "prefer_recompute".
const char* to_string(CheckpointPolicy policy);

/// One operator call of a checkpointed forward, as a policy sees it.
struct OperatorCall {
  std::string_view name;      ///< "aten::mm", "aten::native_layer_norm"
  std::string_view overload;  ///< "Tensor" for aten::add.Tensor; empty for the default overload
  int64_t index = 0;          ///< among this checkpoint's operator calls, from 0, in forward order
  int64_t name_index = 0;     ///< among this checkpoint's calls of the same operator name, from 0
  bool random = false;        ///< draws from an RNG (tagged nondeterministic_seeded, or takes a generator)
  bool writes = false;        ///< changes an argument in place (`add_`, `out=`): never kept
  bool returns_view = false;  ///< returns a view of an argument (`view`, `t`): always recomputed
  /// The call's arguments, as the kernel receives them (tensors, scalars, lists).
  c10::ArrayRef<c10::IValue> arguments;
};

/// Decides, once per operator call of the forward, what to do with the call's results.
using SelectivePolicy = std::function<CheckpointPolicy(const OperatorCall& call)>;

/// The practitioners' rule (and torchtitan's save list): keep the results of matrix products,
/// convolutions and attention kernels (compute_intensive_operators()); recompute everything else —
/// norms, activations, softmax, dropout, elementwise and reshaping operations.
SelectivePolicy save_compute_intensive();
/// torchtitan's "op" checkpointing: as save_compute_intensive, but only every other call of each
/// matrix-product operator is kept (its 1st, 3rd, … call of aten::mm, likewise of aten::addmm, …);
/// attention kernels and convolutions are always kept.
SelectivePolicy save_every_other_matmul();
/// Keeps the results of the named operators ("aten::mm"; a name with an overload, "aten::add.Tensor",
/// matches that overload only) and recomputes the rest. A name no registered operator has is refused.
SelectivePolicy save_operators(std::vector<std::string> names);

/// The operator names save_compute_intensive keeps.
const std::vector<std::string>& compute_intensive_operators();

/// A preset by name: "compute-intensive" or "every-other-matmul"; a clear error for anything else.
SelectivePolicy selective_policy(const std::string& name);
/// The preset names selective_policy accepts.
std::vector<std::string> selective_policy_names();

}  // namespace remat
