#include "checkpoint/forward_state.h"

#include <mutex>

#include <ATen/Context.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include "checkpoint/saved_versions.h"
#include "base/torch_compat.h"
#include "checkpoint/checkpoint_modes.h"
#include "remat/base/error.h"

namespace remat::detail {
namespace {

at::Tensor generator_state(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_generator_state(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

at::Generator cuda_generator(c10::DeviceIndex index) {
  return at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, index));
}

}  // namespace

RngSnapshot RngSnapshot::capture(const std::vector<at::Tensor>& inputs) {
  RngSnapshot snapshot;
  snapshot.cpu_state_ = generator_state(at::detail::getDefaultCPUGenerator());
  for (const auto& input : inputs) {
    if (!input.defined() || !input.is_cuda()) continue;
    const auto index = input.device().index();
    bool seen = false;
    for (const auto& [known, state] : snapshot.cuda_states_) seen = seen || known == index;
    if (!seen) snapshot.cuda_states_.emplace_back(index, generator_state(cuda_generator(index)));
  }
  return snapshot;
}

RngSnapshot RngSnapshot::capture_like(const RngSnapshot& like) {
  RngSnapshot snapshot;
  snapshot.cpu_state_ = generator_state(at::detail::getDefaultCPUGenerator());
  for (const auto& [index, state] : like.cuda_states_) {
    snapshot.cuda_states_.emplace_back(index, generator_state(cuda_generator(index)));
  }
  return snapshot;
}

std::vector<at::Tensor> RngSnapshot::tensors() const {
  std::vector<at::Tensor> out{cpu_state_};
  for (const auto& [index, state] : cuda_states_) out.push_back(state);
  return out;
}

RngSnapshot RngSnapshot::with_tensors(const std::vector<at::Tensor>& tensors) const {
  TORCH_INTERNAL_ASSERT(tensors.size() == 1 + cuda_states_.size(), "RNG snapshot: wrong number of state tensors");
  RngSnapshot out;
  out.cpu_state_ = tensors[0];
  for (size_t i = 0; i < cuda_states_.size(); ++i) out.cuda_states_.emplace_back(cuda_states_[i].first, tensors[i + 1]);
  return out;
}

void RngSnapshot::restore() const {
  set_generator_state(at::detail::getDefaultCPUGenerator(), cpu_state_);
  for (const auto& [index, state] : cuda_states_) set_generator_state(cuda_generator(index), state);
}

ForkedRngScope::ForkedRngScope(const RngSnapshot& forward_state) : saved_(RngSnapshot::capture_like(forward_state)) {
  forward_state.restore();
}

ForkedRngScope::~ForkedRngScope() { saved_.restore(); }

AutocastSnapshot AutocastSnapshot::capture() {
  AutocastSnapshot s;
  s.cpu_enabled = detail::autocast_enabled(c10::DeviceType::CPU);
  s.cpu_dtype = detail::autocast_dtype(c10::DeviceType::CPU);
  s.cuda_enabled = detail::autocast_enabled(c10::DeviceType::CUDA);
  s.cuda_dtype = detail::autocast_dtype(c10::DeviceType::CUDA);
  return s;
}

void AutocastSnapshot::apply() const {
  detail::set_autocast(c10::DeviceType::CPU, cpu_enabled, cpu_dtype);
  detail::set_autocast(c10::DeviceType::CUDA, cuda_enabled, cuda_dtype);
}

AutocastScope::AutocastScope(const AutocastSnapshot& state) : saved_(AutocastSnapshot::capture()) { state.apply(); }

AutocastScope::~AutocastScope() { saved_.apply(); }

RestoreTensorsScope::RestoreTensorsScope(const std::vector<at::Tensor>& tensors) : tensors_(tensors) {
  c10::NoGradGuard no_grad;
  copies_.reserve(tensors.size());
  for (const auto& t : tensors) copies_.push_back(t.defined() ? t.clone() : at::Tensor());
}

RestoreTensorsScope::~RestoreTensorsScope() {
  c10::NoGradGuard no_grad;
  // Below the version counter, as BatchNorm's own update of its running statistics is: undoing the
  // recompute's update must not look like an in-place change to a checkpoint that saved them
  // (SavedVersions), or a second checkpoint sharing the module would refuse to recompute.
  at::AutoDispatchBelowADInplaceOrView below_version_counter;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (copies_[i].defined()) const_cast<at::Tensor&>(tensors_[i]).copy_(copies_[i]);
  }
}

// ---------------------------------------------------------------------------------------------
// Saved-tensor hooks from C++. LibTorch asks the default autograd engine for saved-tensor hooks each
// time an operation saves a tensor for its backward; the base engine answers none. remat installs
// an engine that answers with the innermost SavedTensorHooksScope's hooks on this thread: "drop
// it" lets checkpoint record a forward's graph (to see which parameters it reaches) at no-grad
// memory cost; the non-reentrant checkpoint keeps a handle instead of the tensor.
namespace {

thread_local std::vector<SavedTensorHooksScope::Factory> hook_factories;

struct DroppedSavedTensor final : SavedTensorHooks {
  DroppedSavedTensor(SavedVersions* versions, std::shared_ptr<const std::string> name)
      : SavedTensorHooks("checkpoint's parameter discovery"), versions_(versions), name_(std::move(name)) {}
  void call_pack_hook(const at::Tensor& tensor) override {
    if (versions_ != nullptr) versions_->record(tensor);
  }
  at::Tensor call_unpack_hook() override {
    REMAT_CHECK(false, name_->empty() ? std::string() : describe_input_use(*name_),
                "a backward (torch::autograd::grad or backward) ran inside the function's forward, as a gradient "
                "penalty does, but the reentrant mode records that forward without the tensors autograd saves. "
                "Use the non-reentrant mode, which runs it: CheckpointOptions().use_reentrant(false).");
  }

 private:
  SavedVersions* versions_;
  std::shared_ptr<const std::string> name_;
};

struct RematEngine final : torch::autograd::Engine {
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    if (hook_factories.empty()) return nullptr;
    return hook_factories.back()();
  }
  static torch::autograd::Engine& instance() {
    static RematEngine engine;
    return engine;
  }
};

void install_engine_once() {
  static std::once_flag installed;
  std::call_once(installed, [] { torch::autograd::set_default_engine_stub(&RematEngine::instance); });
}

}  // namespace

SavedTensorHooksScope::SavedTensorHooksScope(Factory make) {
  install_engine_once();
  hook_factories.push_back(std::move(make));
}

SavedTensorHooksScope::~SavedTensorHooksScope() { hook_factories.pop_back(); }

DropSavedTensorsScope::DropSavedTensorsScope(SavedVersions* versions, const std::string& name)
    : hooks_([versions, name = std::make_shared<const std::string>(name)] {
        return std::unique_ptr<torch::autograd::SavedVariableHooks>(new DroppedSavedTensor(versions, name));
      }) {}

}  // namespace remat::detail
