#include "graph/step_recorder.h"

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include <c10/util/intrusive_ptr.h>

#include "base/tensor_text.h"
#include "checkpoint/forward_state.h"
#include "checkpoint/operator_log.h"
#include "remat/base/error.h"
#include "remat/memory/memory.h"

namespace remat::detail {

int64_t bytes_now(c10::Device device) { return memory_stats(device).current_bytes; }

namespace {
// The most the allocator held since the last reading, and a new interval from now.
int64_t peak_since_last(RecordedStep& step, int64_t bytes_before) {
  const int64_t peak = memory_stats(step.device).peak_bytes - bytes_before;
  step.measured_peak = std::max(step.measured_peak, peak);
  reset_peak_memory(step.device);
  return peak;
}
}  // namespace

const at::Tensor* slot_tensor(c10::ArrayRef<c10::IValue> values, const TensorSlot& slot, at::Tensor& scratch) {
  if (slot.position >= values.size()) return nullptr;
  const c10::IValue& value = values[slot.position];
  if (slot.element < 0) return value.isTensor() ? &value.toTensor() : nullptr;
  const auto element = static_cast<size_t>(slot.element);
  if (value.isTensorList()) {
    const c10::List<at::Tensor> list = value.toTensorList();
    if (element >= list.size()) return nullptr;  // a list of another length than the record's
    scratch = list.get(element);
    return &scratch;
  }
  if (value.isList()) {
    const auto list = value.toListRef();
    if (element >= list.size() || !list[element].isTensor()) return nullptr;
    scratch = list[element].toTensor();
    return &scratch;
  }
  return nullptr;
}

void version_check(const c10::VariableVersion& counter, uint32_t version, const SavedEntry& entry, const char* where) {
  if (!counter.enabled() || counter.current_version() == version) return;
  REMAT_CHECK(false, where, ": one of the tensors needed for gradient computation (",
              tensor_text(entry.sizes, entry.dtype),
              ", saved by the forward) has been modified by an inplace operation: it is at version ",
              counter.current_version(), ", the forward saved version ", version,
              ". The unplanned step refuses this too; change the tensor only after backward, or clone it before "
              "changing it.");
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// What the recorder saw of the step so far, while its forward runs.
struct Recorder final : CallObserver {
  std::shared_ptr<RecordedStep> step;
  int64_t bytes_before = 0;
  bool device_known = false;
  c10::Device seen_device = c10::kCPU;
  std::unordered_map<const c10::TensorImpl*, int64_t> value_of_impl;
  std::unordered_map<const c10::StorageImpl*, int64_t> storage_of_impl;
  // Held weakly so that no address is reused by another tensor while the forward runs.
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> impls;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> storage_impls;

  int64_t value_of(const at::Tensor& t) const {
    const auto found = value_of_impl.find(t.unsafeGetTensorImpl());
    return found == value_of_impl.end() ? -1 : found->second;
  }

  int64_t storage_of(const at::Tensor& t, bool outside) {
    if (!t.has_storage()) return -1;
    const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    const auto found = storage_of_impl.find(impl);
    if (found != storage_of_impl.end()) return found->second;
    const int64_t id = static_cast<int64_t>(step->storages.size());
    RecordedStorage storage;
    storage.outside = outside;
    storage.bytes = outside ? 0 : static_cast<int64_t>(t.storage().nbytes());
    step->storages.push_back(storage);
    storage_of_impl.emplace(impl, id);
    storage_impls.push_back(t.storage().getWeakStorageImpl());
    return id;
  }

  void read(RecordedCall& call, TensorSlot slot, const at::Tensor& t, int64_t index) {
    if (!t.defined()) return;
    slot.value = value_of(t);
    if (slot.value < 0) {
      storage_of(t, /*outside=*/true);
    } else {
      RecordedValue& value = step->values[static_cast<size_t>(slot.value)];
      RecordedStorage& storage = step->storages[static_cast<size_t>(value.storage)];
      slot.stale = value.storage_writes != storage.writes;
      value.last_read = index;
    }
    call.slots.push_back(slot);
  }

  // The values whose tensors the program still holds: where it drops the last tensor of a storage
  // is where the storage would be freed if autograd did not save it (a C++ temporary lives to the
  // end of its full expression, past its last read).
  std::vector<std::pair<int64_t, size_t>> live;  // value, index into impls

  void note_deaths(int64_t last_alive) {
    size_t kept = 0;
    for (const auto& [value, impl] : live) {
      if (!impls[impl].expired()) {
        live[kept++] = {value, impl};
        continue;
      }
      RecordedStorage& storage = step->storages[static_cast<size_t>(step->values[static_cast<size_t>(value)].storage)];
      storage.dies_after = std::max(storage.dies_after, last_alive);
    }
    live.resize(kept);
  }

  void forward_ended() { note_deaths(static_cast<int64_t>(step->calls.size()) - 1); }

  void on_call(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) override {
    const OperatorFacts& facts = operator_facts(op);
    const c10::FunctionSchema& schema = op.schema();
    const int64_t index = static_cast<int64_t>(step->calls.size());
    note_deaths(index - 1);
    const size_t num_arguments = schema.arguments().size();
    const c10::ArrayRef<c10::IValue> arguments(stack->data() + stack->size() - num_arguments, num_arguments);
    RecordedCall call;
    call.op = op;
    call.name = schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
    call.random = facts.random;
    std::vector<const c10::TensorImpl*> argument_impls;
    for (size_t i = 0; i < num_arguments; ++i) {
      const c10::IValue& argument = arguments[i];
      const bool written = std::find(facts.written.begin(), facts.written.end(), i) != facts.written.end();
      TensorSlot slot;
      slot.position = static_cast<uint32_t>(i);
      slot.written = written;
      if (argument.isTensor()) {
        read(call, slot, argument.toTensor(), index);
        if (argument.toTensor().defined()) argument_impls.push_back(argument.toTensor().unsafeGetTensorImpl());
        call.arguments.emplace_back(at::Tensor());
      } else if (argument.isTensorList()) {
        const c10::List<at::Tensor> list = argument.toTensorList();
        c10::List<at::Tensor> placeholder;
        for (size_t j = 0; j < list.size(); ++j) {
          slot.element = static_cast<int32_t>(j);
          const at::Tensor t = list.get(j);
          read(call, slot, t, index);
          if (t.defined()) argument_impls.push_back(t.unsafeGetTensorImpl());
          placeholder.push_back(at::Tensor());
        }
        call.arguments.emplace_back(std::move(placeholder));
      } else if (argument.isList()) {
        c10::impl::GenericList placeholder = argument.toList().copy();
        for (size_t j = 0; j < placeholder.size(); ++j) {
          const c10::IValue element = placeholder.get(j);
          if (!element.isTensor()) continue;
          slot.element = static_cast<int32_t>(j);
          read(call, slot, element.toTensor(), index);
          if (element.toTensor().defined()) argument_impls.push_back(element.toTensor().unsafeGetTensorImpl());
          placeholder.set(j, c10::IValue());
        }
        call.arguments.emplace_back(std::move(placeholder));
      } else {
        if (argument.isGenerator() && facts.takes_generator) call.not_replayable = "is given a generator";
        call.arguments.push_back(argument);
      }
    }
    if (schema.name().rfind("aten::", 0) != 0) {
      call.not_replayable = "is not one of LibTorch's aten operators (a custom operator or a collective)";
    }

    const auto start = Clock::now();
    run_kernel(op, keys, stack);
    call.seconds = seconds_since(start);

    const size_t num_results = schema.returns().size();
    const c10::ArrayRef<c10::IValue> results(stack->data() + stack->size() - num_results, num_results);
    // Writes: the written step-made tensors get a new value (below, if returned) and their storage a
    // write, so that a later read of an older value is known to be stale.
    for (const TensorSlot& slot : call.slots) {
      if (!slot.written || slot.value < 0) continue;
      ++step->storages[static_cast<size_t>(step->values[static_cast<size_t>(slot.value)].storage)].writes;
    }
    auto make_value = [&](const at::Tensor& t, TensorSlot slot) {
      if (!t.defined()) return;
      if (!device_known) {
        seen_device = t.device();
        device_known = true;
      }
      const int64_t storage = storage_of(t, /*outside=*/false);
      RecordedValue value;
      value.call = index;
      value.storage = storage < 0 ? storage_of_placeholder() : storage;
      RecordedStorage& held = step->storages[static_cast<size_t>(value.storage)];
      value.storage_writes = held.writes;
      value.sizes = t.sizes().vec();
      value.dtype = t.scalar_type();
      slot.value = static_cast<int64_t>(step->values.size());
      held.last_value = slot.value;
      held.dies_after = std::max(held.dies_after, index);
      step->values.push_back(std::move(value));
      value_of_impl[t.unsafeGetTensorImpl()] = slot.value;
      live.emplace_back(slot.value, impls.size());
      impls.emplace_back(t.getIntrusivePtr());
      call.results.push_back(slot);
    };
    for (size_t r = 0; r < num_results; ++r) {
      TensorSlot slot;
      slot.position = static_cast<uint32_t>(r);
      if (results[r].isTensor()) {
        make_value(results[r].toTensor(), slot);
      } else if (results[r].isTensorList()) {
        const c10::List<at::Tensor> list = results[r].toTensorList();
        for (size_t j = 0; j < list.size(); ++j) {
          slot.element = static_cast<int32_t>(j);
          make_value(list.get(j), slot);
        }
      }
    }
    call.bytes_after = bytes_now(step->device) - bytes_before;
    call.peak = peak_since_last(*step, bytes_before);
    step->calls.push_back(std::move(call));
  }

  // A result without storage (a sparse or opaque tensor): memory the plan does not see.
  int64_t storage_of_placeholder() {
    RecordedStorage storage;
    storage.outside = true;
    step->storages.push_back(storage);
    return static_cast<int64_t>(step->storages.size()) - 1;
  }

  // The entry a saved tensor is: the newest value of its storage, in its own geometry.
  SavedEntry entry_of(const at::Tensor& t) {
    SavedEntry entry;
    entry.sizes = t.sizes().vec();
    entry.strides = t.strides().vec();
    entry.offset = t.storage_offset();
    entry.dtype = t.scalar_type();
    if (!t.has_storage()) return entry;
    const auto found = storage_of_impl.find(t.storage().unsafeGetStorageImpl());
    if (found == storage_of_impl.end()) return entry;
    const RecordedStorage& storage = step->storages[static_cast<size_t>(found->second)];
    if (storage.outside) return entry;
    entry.storage = found->second;
    entry.value = storage.last_value;
    return entry;
  }
};

// The record step's hooks: keep every saved tensor (the step runs unplanned) and log the backward.
struct RecordingHooks final : SavedTensorHooks {
  RecordingHooks(std::shared_ptr<RecordedStep> step, Recorder* recorder, int64_t bytes_before, Clock::time_point start)
      : SavedTensorHooks("a step remat records for planning"),
        step_(std::move(step)),
        recorder_(recorder),
        bytes_before_(bytes_before),
        start_(start) {}

  void call_pack_hook(const at::Tensor& tensor) override {
    entry_ = static_cast<int64_t>(step_->saved.size());
    SavedEntry entry = recorder_->entry_of(tensor);
    if (entry.storage >= 0) step_->storages[static_cast<size_t>(entry.storage)].saved.push_back(entry_);
    step_->saved.push_back(std::move(entry));
    kept_ = tensor.tensor_data();  // not the program's own tensor: its death is the recorder's to see
    counter_ = tensor.unsafeGetTensorImpl()->version_counter();
    version_ = counter_.enabled() ? counter_.current_version() : 0;
    recorder_ = nullptr;  // the forward's, gone after it
  }

  at::Tensor call_unpack_hook() override {
    version_check(counter_, version_, step_->saved[static_cast<size_t>(entry_)], "remat: the recorded step");
    step_->backward.push_back(
        {true, entry_, bytes_now(step_->device) - bytes_before_, peak_since_last(*step_, bytes_before_)});
    return kept_;
  }

  ~RecordingHooks() override {
    if (entry_ < 0) return;
    try {
      step_->backward.push_back(
          {false, entry_, bytes_now(step_->device) - bytes_before_, peak_since_last(*step_, bytes_before_)});
      if (++step_->released == static_cast<int64_t>(step_->saved.size())) {
        step_->step_seconds = seconds_since(start_);
        // What a caller measuring around the step would have seen without the intervals.
        raise_peak_memory(step_->measured_peak + bytes_before_, step_->device);
      }
    } catch (...) {  // a destructor: the record stays incomplete and the next step records again
    }
  }

 private:
  std::shared_ptr<RecordedStep> step_;
  Recorder* recorder_;
  int64_t bytes_before_;
  Clock::time_point start_;
  int64_t entry_ = -1;
  at::Tensor kept_;
  c10::VariableVersion counter_;
  uint32_t version_ = 0;
};

}  // namespace

at::Tensor record_step(const std::function<at::Tensor()>& forward, std::shared_ptr<RecordedStep>& recorded,
                       c10::Device device) {
  auto step = std::make_shared<RecordedStep>();
  step->device = device;
  Recorder recorder;
  recorder.step = step;
  reset_peak_memory(device);
  recorder.bytes_before = bytes_now(device);
  const auto start = Clock::now();
  at::Tensor loss;
  {
    SavedTensorHooksScope hooks([&] {
      return std::unique_ptr<torch::autograd::SavedVariableHooks>(
          new RecordingHooks(step, &recorder, recorder.bytes_before, start));
    });
    ObservedCalls observed(recorder);
    loss = forward();
    recorder.forward_ended();
  }
  step->forward_seconds = seconds_since(start);
  for (const at::Tensor& state : RngSnapshot::capture({}).tensors())
    step->rng_state_bytes += static_cast<int64_t>(state.nbytes());
  REMAT_CHECK(!recorder.device_known || recorder.seen_device.type() == device.type(), "the step's tensors are on ",
              recorder.seen_device, " but a planned step measures memory on ", device,
              ": set PlannedStepOptions::device to the device the model runs on.");
  recorded = step;
  return loss;
}

}  // namespace remat::detail
