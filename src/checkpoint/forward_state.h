// Internal: the ambient state a recompute must see exactly as the forward saw it — RNG streams,
// autocast — plus the side effects (buffer updates) it must not repeat, and the switch that makes
// autograd drop saved tensors while checkpoint records a graph only to find parameters.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

// Newer LibTorch adds a pure virtual `compiled_args` to SavedVariableHooks (for torch.compile's
// compiled autograd). Declaring its parameter types here lets remat's hooks define it so that it
// overrides where it exists and is a harmless extra method where it does not.
namespace torch::dynamo::autograd {
class CompiledNodeArgs;
struct VariableMetadata;
}  // namespace torch::dynamo::autograd
namespace torch::autograd {
class SavedVariable;
}  // namespace torch::autograd

namespace remat::detail {

class SavedVersions;

/// RNG states of the CPU generator and of the CUDA devices the inputs live on.
class RngSnapshot {
 public:
  static RngSnapshot capture(const std::vector<at::Tensor>& inputs);
  /// Captures the current state of the same generators as `like`.
  static RngSnapshot capture_like(const RngSnapshot& like);
  void restore() const;

  /// The state tensors (CPU first, then each CUDA device's), so the caller can keep them where
  /// autograd frees them after backward; `with_tensors` puts them back.
  std::vector<at::Tensor> tensors() const;
  RngSnapshot with_tensors(const std::vector<at::Tensor>& tensors) const;

 private:
  at::Tensor cpu_state_;
  std::vector<std::pair<c10::DeviceIndex, at::Tensor>> cuda_states_;
};

/// Sets the forward's RNG states for the lifetime of the scope, then puts back the current ones,
/// so the recompute does not disturb the caller's RNG stream.
class ForkedRngScope {
 public:
  explicit ForkedRngScope(const RngSnapshot& forward_state);
  ~ForkedRngScope();
  ForkedRngScope(const ForkedRngScope&) = delete;
  ForkedRngScope& operator=(const ForkedRngScope&) = delete;

 private:
  RngSnapshot saved_;
};

/// Autocast enablement and dtypes for CPU and CUDA.
struct AutocastSnapshot {
  bool cpu_enabled = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  bool cuda_enabled = false;
  at::ScalarType cuda_dtype = at::kHalf;

  static AutocastSnapshot capture();
  void apply() const;
};

/// Applies an autocast snapshot for the lifetime of the scope.
class AutocastScope {
 public:
  explicit AutocastScope(const AutocastSnapshot& state);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  AutocastSnapshot saved_;
};

/// Copies the given tensors on entry and writes the copies back on exit: a recompute's in-place
/// side effects on them (running statistics) are undone.
class RestoreTensorsScope {
 public:
  explicit RestoreTensorsScope(const std::vector<at::Tensor>& tensors);
  ~RestoreTensorsScope();
  RestoreTensorsScope(const RestoreTensorsScope&) = delete;
  RestoreTensorsScope& operator=(const RestoreTensorsScope&) = delete;

 private:
  const std::vector<at::Tensor>& tensors_;
  std::vector<at::Tensor> copies_;
};

/// Base of remat's saved-tensor hooks: refuses compiled autograd (torch.compile), whose tracing
/// LibTorch 2.x asks hooks for; the hooks below only make sense run eagerly. `what` names the user
/// in that error.
struct SavedTensorHooks : torch::autograd::SavedVariableHooks {
  explicit SavedTensorHooks(const char* what) : what_(what) {}
  virtual void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& /*args*/,
                             const torch::autograd::SavedVariable& /*saved*/,
                             const std::shared_ptr<torch::dynamo::autograd::VariableMetadata>& /*meta*/) {
    TORCH_CHECK(false, "remat: compiled autograd cannot trace ", what_);
  }

 private:
  const char* what_;
};

/// While alive on this thread, every tensor an operation saves for its backward goes through the
/// hooks `make` returns (LibTorch's saved-tensor hooks, from C++: remat installs an autograd engine
/// that answers with them). Scopes nest; the innermost wins.
class SavedTensorHooksScope {
 public:
  using Factory = std::function<std::unique_ptr<torch::autograd::SavedVariableHooks>()>;
  explicit SavedTensorHooksScope(Factory make);
  ~SavedTensorHooksScope();
  SavedTensorHooksScope(const SavedTensorHooksScope&) = delete;
  SavedTensorHooksScope& operator=(const SavedTensorHooksScope&) = delete;
};

/// While alive on this thread, autograd records graphs but keeps none of the tensors that
/// operations save for their backward: recording costs what a no-grad forward costs in memory.
/// Using such a graph for backward raises an error naming remat.
class DropSavedTensorsScope {
 public:
  /// `versions`, if given, records each dropped tensor's version (it must outlive the scope); `name`
  /// names the checkpoint in the error of a backward that reaches a dropped tensor.
  explicit DropSavedTensorsScope(SavedVersions* versions = nullptr, const std::string& name = "");
  DropSavedTensorsScope(const DropSavedTensorsScope&) = delete;
  DropSavedTensorsScope& operator=(const DropSavedTensorsScope&) = delete;

 private:
  SavedTensorHooksScope hooks_;
};

}  // namespace remat::detail
