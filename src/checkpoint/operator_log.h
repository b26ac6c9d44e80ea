// Internal: the operator calls of one checkpointed forward, intercepted below autograd, so that its
// recompute can replay them: return the results a selective policy kept instead of running the call,
// check that each call is the forward's (same operator, in order), and that each reads the same
// tensors from outside the function, unchanged (CheckpointOptions::check_reads).
//
// Interception uses the dispatch key Fake: no LibTorch kernel is registered for it (it belongs to
// out-of-tree fake tensors), it sits below autograd and autocast and above the backends, and a
// fallback for it sees every operator call made while the key is in the thread's included set.
// The fallback is registered on first use, so a process that never asks pays nothing and a library
// that took the key first is named in a clear error. Only the calls the function makes itself are
// seen: while a call runs its kernel the key is excluded, and a checkpoint nested in the function
// hides its own calls (it intercepts them into a log of its own, or not at all).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "remat/checkpoint/checkpoint.h"

namespace remat::detail {

class OperatorLog {
 public:
  OperatorLog(const CheckpointOptions& options, const std::vector<at::Tensor>& inputs);
  ~OperatorLog();
  OperatorLog(const OperatorLog&) = delete;
  OperatorLog& operator=(const OperatorLog&) = delete;

  /// Whether `options` ask for a log (a policy, or check_reads), given where the checkpoint runs:
  /// a policy inside another checkpoint's forward keeps nothing (that checkpoint recomputes this
  /// one, whose recompute keeps what the policy says), so there only check_reads asks for one.
  static bool wanted(const CheckpointOptions& options);

  /// Intercepts the forward's calls while alive: records them, asks the policy, keeps results.
  class Recording;
  /// Intercepts a recompute's calls while alive: checks them against the log, returns kept results.
  class Replaying;

  /// `listed` (CheckpointOptions::restore_after_recompute) and the tensors from outside the function
  /// that its forward changed in place (BatchNorm's running statistics): what a recompute, which
  /// changes them again, must put back as the forward left them.
  std::vector<at::Tensor> restored_after_recompute(const std::vector<at::Tensor>& listed) const;

  /// Bytes of the results kept for the recompute (storages counted once).
  int64_t kept_bytes() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

class OperatorLog::Recording {
 public:
  Recording(OperatorLog& log, const std::vector<at::Tensor>& inputs);
  ~Recording();
  Recording(const Recording&) = delete;
  Recording& operator=(const Recording&) = delete;

 private:
  struct Scope;
  std::unique_ptr<Scope> scope_;
};

class OperatorLog::Replaying {
 public:
  /// The first replay returns the kept results and releases them when it ends (unless `release` is
  /// false: a recompute for a backward inside the forward); a later one (a second backward) runs
  /// every call again.
  Replaying(OperatorLog& log, const std::vector<at::Tensor>& inputs, bool release = true);
  ~Replaying();
  Replaying(const Replaying&) = delete;
  Replaying& operator=(const Replaying&) = delete;
  /// Refuses a replay that made fewer calls than the forward (one that ran to its end).
  void check_complete() const;

 private:
  struct Scope;
  std::unique_ptr<Scope> scope_;
  bool release_;
};

/// Hides a checkpoint's own work from the interception of an enclosing function (its bookkeeping
/// and the calls of a function it runs without a log) while alive; on `outputs_created`, the
/// enclosing log counts them as made by its function. A no-op where nothing intercepts.
class HiddenFromEnclosingLog {
 public:
  HiddenFromEnclosingLog();
  ~HiddenFromEnclosingLog();
  HiddenFromEnclosingLog(const HiddenFromEnclosingLog&) = delete;
  HiddenFromEnclosingLog& operator=(const HiddenFromEnclosingLog&) = delete;
  void outputs_created(const std::vector<at::Tensor>& outputs);

 private:
  void* enclosing_;
  c10::impl::LocalDispatchKeySet saved_keys_;
};

/// What an operator's schema and tags say about its calls.
struct OperatorFacts {
  bool random = false;           ///< draws from an RNG: tagged nondeterministic_seeded, or takes a generator
  bool takes_generator = false;  ///< has a Generator argument
  bool returns_alias = false;    ///< a result is a view of an argument or the argument itself
  std::vector<size_t> written;   ///< arguments it changes in place (schema, plus those 1.13's schemas omit)
};
const OperatorFacts& operator_facts(const c10::OperatorHandle& op);

/// Sees the operator calls made on this thread while an ObservedCalls scope for it is alive, where
/// no checkpoint's log intercepts them (a selective checkpoint inside hides its calls): the step
/// recorder of remat/graph. on_call must run the call, through run_kernel.
class CallObserver {
 public:
  virtual ~CallObserver() = default;
  virtual void on_call(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) = 0;
  /// Runs the call's kernel (and whatever it calls) unobserved.
  static void run_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);
};

class ObservedCalls {
 public:
  explicit ObservedCalls(CallObserver& observer);
  ~ObservedCalls();
  ObservedCalls(const ObservedCalls&) = delete;
  ObservedCalls& operator=(const ObservedCalls&) = delete;

 private:
  CallObserver* previous_;
  c10::impl::LocalDispatchKeySet saved_keys_;
};

/// Whether a selective policy is deciding a call on this thread (checkpoint() refuses to run there).
bool inside_selective_policy();

/// Marks the forward of a checkpoint on this thread while alive (a recompute is not one): a policy
/// of a checkpoint nested inside keeps nothing (OperatorLog::wanted).
class CheckpointForwardScope {
 public:
  explicit CheckpointForwardScope(bool forward);
  ~CheckpointForwardScope();
  CheckpointForwardScope(const CheckpointForwardScope&) = delete;
  CheckpointForwardScope& operator=(const CheckpointForwardScope&) = delete;

 private:
  bool previous_;
};

}  // namespace remat::detail
