#include "remat/graph/planned_step.h"

#include <chrono>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/clone.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>

#include "checkpoint/forward_state.h"
#include "checkpoint/operator_log.h"
#include "graph/recorded_step.h"
#include "graph/step_recorder.h"
#include "remat/base/error.h"
#include "remat/memory/memory.h"

namespace remat {
namespace {

using detail::RecordedCall;
using detail::RecordedStep;
using detail::SavedEntry;
using detail::TensorSlot;

size_t at(int64_t index) { return static_cast<size_t>(index); }

std::string mib(int64_t bytes) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(1);
  out << static_cast<double>(bytes) / (1024.0 * 1024.0) << " MiB";
  return out.str();
}

// The plan as the runtime uses it.
struct RunPlan {
  std::shared_ptr<const RecordedStep> step;
  detail::StepDrops drops;
  detail::Rebuilds rebuilds;
};

// One planned step: what its forward made that replays need, and the backward's rebuilt tensors.
struct StepRun final : detail::CallObserver, std::enable_shared_from_this<StepRun> {
  explicit StepRun(std::shared_ptr<const RunPlan> plan_in) : plan(std::move(plan_in)) {
    const RecordedStep& step = *plan->step;
    value_impls.resize(step.values.size());
    storage_impls.resize(step.storages.size());
    sources.resize(step.values.size());
    outside.resize(step.calls.size());
    outside_versions.resize(step.calls.size());
    rng_before.resize(step.calls.size());
    pending_entries.assign(step.storages.size(), 0);
    for (const SavedEntry& entry : step.saved) {
      if (entry.storage >= 0 && plan->drops.dropped[at(entry.storage)]) ++pending_entries[at(entry.storage)];
    }
    source_uses.assign(step.values.size(), 0);
    for (const auto& sources_of_entry : plan->rebuilds.sources_of) {
      for (int64_t v : sources_of_entry) ++source_uses[at(v)];
    }
  }

  std::shared_ptr<const RunPlan> plan;
  // Forward.
  int64_t next_call = 0;
  int64_t next_entry = 0;
  bool differed = false;
  std::string difference;
  using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  std::vector<std::optional<WeakImpl>> value_impls;
  std::vector<std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>>> storage_impls;
  std::vector<at::Tensor> sources;               // per value: held for replays
  std::vector<std::vector<at::Tensor>> outside;  // per replayed call: its tensors from outside, by slot
  std::vector<std::vector<uint32_t>> outside_versions;
  std::vector<std::optional<detail::RngSnapshot>> rng_before;
  // Backward.
  std::mutex mutex;
  std::unordered_map<int64_t, at::Tensor> cache;  // value -> rebuilt tensor
  std::vector<int64_t> pending_entries;           // per storage: dropped entries not yet unpacked
  std::vector<int64_t> source_uses;               // per value: dropped entries that may replay from it

  void differ(std::string what) {
    if (differed) return;
    differed = true;
    difference = std::move(what);
  }

  void on_call(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) override {
    if (differed) return run_kernel(op, keys, stack);
    const RecordedStep& step = *plan->step;
    const int64_t index = next_call++;
    const c10::FunctionSchema& schema = op.schema();
    if (index >= static_cast<int64_t>(step.calls.size())) {
      differ("it made more operator calls than the recorded step's " + std::to_string(step.calls.size()));
      return run_kernel(op, keys, stack);
    }
    const RecordedCall& call = step.calls[at(index)];
    if (&call.op->schema() != &schema) {
      differ("its operator call " + std::to_string(index) + " is " + schema.name() + " where the recorded step's was " +
             call.name);
      return run_kernel(op, keys, stack);
    }
    const size_t num_arguments = schema.arguments().size();
    const c10::ArrayRef<c10::IValue> arguments(stack->data() + stack->size() - num_arguments, num_arguments);
    at::Tensor scratch;
    const bool replayed = plan->rebuilds.replayed[at(index)];
    for (const TensorSlot& slot : call.slots) {
      const at::Tensor* t = detail::slot_tensor(arguments, slot, scratch);
      if (t == nullptr || !t->defined()) {
        differ("its operator call " + std::to_string(index) + " (" + call.name + ") has other tensor arguments");
        return run_kernel(op, keys, stack);
      }
      if (slot.value >= 0) {
        const auto& made = value_impls[at(slot.value)];
        if (!made || made->lock().get() != t->unsafeGetTensorImpl()) {
          differ("its operator call " + std::to_string(index) + " (" + call.name +
                 ") reads another tensor than the recorded step's call did");
          return run_kernel(op, keys, stack);
        }
      } else if (replayed) {
        outside[at(index)].push_back(*t);
        const auto& counter = t->unsafeGetTensorImpl()->version_counter();
        outside_versions[at(index)].push_back(counter.enabled() ? counter.current_version() : 0);
      }
    }
    if (replayed && call.random) {
      std::vector<at::Tensor> tensors;
      for (const TensorSlot& slot : call.slots) tensors.push_back(*detail::slot_tensor(arguments, slot, scratch));
      rng_before[at(index)] = detail::RngSnapshot::capture(tensors);
    }
    run_kernel(op, keys, stack);
    const size_t num_results = schema.returns().size();
    const c10::ArrayRef<c10::IValue> results(stack->data() + stack->size() - num_results, num_results);
    for (const TensorSlot& slot : call.results) {
      const at::Tensor* t = detail::slot_tensor(results, slot, scratch);
      const detail::RecordedValue& value = step.values[at(slot.value)];
      if (t == nullptr || !t->defined() || t->sizes() != c10::IntArrayRef(value.sizes) ||
          t->scalar_type() != value.dtype) {
        differ("its operator call " + std::to_string(index) + " (" + call.name +
               ") made a tensor of another shape or type than the recorded step's");
        return;
      }
      value_impls[at(slot.value)] = WeakImpl(t->getIntrusivePtr());
      if (t->has_storage()) storage_impls[at(value.storage)] = t->storage().getWeakStorageImpl();
      // Without autograd's metadata (holding the graph from a hook it owns would never free it) and
      // with a version counter of its own: a factory's result shared with anyone else is copied
      // into another tensor when autograd wraps it, and the program would read that one.
      if (plan->rebuilds.source[at(slot.value)]) sources[at(slot.value)] = t->variable_data();
    }
  }

  // Whether a saved tensor is the recorded entry's: the storage this step's calls made where the
  // record's did, in the same geometry.
  bool matches(const SavedEntry& entry, const at::Tensor& t) {
    if (entry.storage < 0 || !t.has_storage()) return false;
    const auto& made = storage_impls[at(entry.storage)];
    return made && made->lock().get() == t.storage().unsafeGetStorageImpl() &&
           t.sizes() == c10::IntArrayRef(entry.sizes) && t.strides() == c10::IntArrayRef(entry.strides) &&
           t.storage_offset() == entry.offset;
  }

  // Decides a pack: true drops the tensor (rebuilt at unpack), false keeps it.
  bool drop_on_pack(int64_t entry, const at::Tensor& t) {
    const RecordedStep& step = *plan->step;
    if (differed) return false;
    if (entry >= static_cast<int64_t>(step.saved.size())) {
      differ("autograd saved more tensors than in the recorded step");
      return false;
    }
    const SavedEntry& recorded = step.saved[at(entry)];
    if (recorded.storage < 0) return false;
    if (!matches(recorded, t)) {
      differ("the tensor autograd saved " + std::to_string(entry + 1) + "th is not the recorded step's");
      return false;
    }
    return plan->drops.dropped[at(recorded.storage)];
  }

  at::Tensor rebuild(int64_t entry) {
    std::lock_guard<std::mutex> lock(mutex);
    const RecordedStep& step = *plan->step;
    const SavedEntry& recorded = step.saved[at(entry)];
    auto found = cache.find(recorded.value);
    at::Tensor value = found == cache.end() ? replay(entry) : found->second;
    at::Tensor out = value;
    if (value.sizes() != c10::IntArrayRef(recorded.sizes) || value.strides() != c10::IntArrayRef(recorded.strides) ||
        value.storage_offset() != recorded.offset) {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      out = value.as_strided(recorded.sizes, recorded.strides, recorded.offset);
    }
    const size_t s = at(recorded.storage);
    if (pending_entries[s] > 0 && --pending_entries[s] == 0) {
      for (auto it = cache.begin(); it != cache.end();) {
        it = step.values[at(it->first)].storage == recorded.storage ? cache.erase(it) : std::next(it);
      }
    }
    for (int64_t v : plan->rebuilds.sources_of[at(entry)]) {
      if (source_uses[at(v)] > 0 && --source_uses[at(v)] == 0) sources[at(v)] = at::Tensor();
    }
    return out;
  }

  at::Tensor replay(int64_t entry) {
    const RecordedStep& step = *plan->step;
    const auto& calls = plan->rebuilds.calls_of[at(entry)];
    const auto done = detail::storages_done_after(step, calls);
    const int64_t target_value = step.saved[at(entry)].value;
    std::unordered_map<int64_t, at::Tensor> made;
    std::unordered_map<int64_t, at::Tensor> kept;  // what the replay keeps: its target, then the cache's
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    c10::impl::ExcludeDispatchKeyGuard unobserved(c10::DispatchKey::Fake);
    detail::AutocastScope no_autocast(detail::AutocastSnapshot{});
    at::Tensor scratch;
    for (size_t k = 0; k < calls.size(); ++k) {
      const int64_t c = calls[k];
      const RecordedCall& call = step.calls[at(c)];
      torch::jit::Stack stack(call.arguments.begin(), call.arguments.end());
      size_t next_outside = 0;
      for (const TensorSlot& slot : call.slots) {
        at::Tensor t;
        if (slot.value >= 0) {
          // A call that writes in place writes what this replay made; anything else it would write
          // (a kept tensor, one rebuilt for later unpacks) is copied first.
          bool own = false;
          auto m = made.find(slot.value);
          if (m != made.end()) {
            t = m->second;
            own = cache.count(slot.value) == 0;
          } else if (auto k = cache.find(slot.value); k != cache.end()) {
            t = k->second;
          } else {
            t = sources[at(slot.value)];
          }
          if (slot.written && !own && t.defined()) t = at::clone(t);
          REMAT_CHECK(t.defined(), "a planned step's backward needs to rebuild a saved tensor again (", call.name,
                      ", call ", c,
                      "), after the tensors it is rebuilt from were freed: a second backward through a planned "
                      "step is not supported; run the step again for each backward.");
        } else {
          t = outside[at(c)][next_outside];
          const uint32_t version = outside_versions[at(c)][next_outside++];
          const auto& counter = t.unsafeGetTensorImpl()->version_counter();
          if (slot.written) {
            t = at::clone(t);  // BatchNorm's running statistics: the replay must not update them again
          } else {
            REMAT_CHECK(!counter.enabled() || counter.current_version() == version,
                        "remat: a planned step's backward replays ", call.name, " (call ", c,
                        "), which reads a tensor from outside the step that was modified in place after the "
                        "forward (its version is ",
                        counter.current_version(), ", the forward read version ", version,
                        "): the replay would compute with the new values. Change it only after backward, or "
                        "clone it before changing it.");
          }
        }
        c10::IValue& argument = stack[slot.position];
        if (slot.element < 0) {
          argument = t;
        } else if (argument.isTensorList()) {
          auto list = argument.toTensorList().copy();
          list.set(static_cast<size_t>(slot.element), t);
          argument = std::move(list);
        } else {
          auto list = argument.toList().copy();
          list.set(static_cast<size_t>(slot.element), t);
          argument = std::move(list);
        }
      }
      {
        std::optional<detail::ForkedRngScope> rng;
        if (call.random) rng.emplace(*rng_before[at(c)]);
        call.op->callBoxed(stack);
      }
      for (const TensorSlot& slot : call.results) {
        const at::Tensor* t = detail::slot_tensor(stack, slot, scratch);
        REMAT_CHECK(t != nullptr && t->defined() && t->sizes() == c10::IntArrayRef(step.values[at(slot.value)].sizes),
                    "remat: a planned step's backward replayed ", call.name, " (call ", c,
                    ") and it made a tensor of another shape than in the forward: the operator is not a pure "
                    "function of its arguments.");
        made[slot.value] = *t;
        if (slot.value == target_value) kept[slot.value] = *t;
        // Keep what later unpacks of dropped entries will ask for, as a non-reentrant checkpoint
        // keeps its recompute's saved tensors.
        const int64_t s = step.values[at(slot.value)].storage;
        if (!plan->drops.dropped[at(s)] || pending_entries[at(s)] == 0) continue;
        if (!plan->drops.keep_rebuilt && slot.value != target_value) continue;
        for (int64_t e : step.storages[at(s)].saved) {
          if (step.saved[at(e)].value == slot.value) {
            cache[slot.value] = *t;
            break;
          }
        }
      }
      // Let go of what no later call of the replay reads (the simulation frees it there too).
      for (int64_t s : done[k]) {
        for (auto it = made.begin(); it != made.end();) {
          it = step.values[at(it->first)].storage == s ? made.erase(it) : std::next(it);
        }
      }
    }
    const auto target = kept.find(target_value);
    TORCH_INTERNAL_ASSERT(target != kept.end(), "a rebuild did not make its entry's value");
    return target->second;
  }
};

// The hooks of a planned step's saved tensors.
struct PlannedHooks final : detail::SavedTensorHooks {
  explicit PlannedHooks(std::shared_ptr<StepRun> run)
      : detail::SavedTensorHooks("a planned step"), run_(std::move(run)) {}

  void call_pack_hook(const at::Tensor& tensor) override {
    entry_ = run_->next_entry++;
    counter_ = tensor.unsafeGetTensorImpl()->version_counter();
    version_ = counter_.enabled() ? counter_.current_version() : 0;
    dropped_ = run_->drop_on_pack(entry_, tensor);
    if (!dropped_) kept_ = tensor;
    described_.sizes = tensor.sizes().vec();
    described_.dtype = tensor.scalar_type();
  }

  at::Tensor call_unpack_hook() override {
    detail::version_check(counter_, version_, described_, "remat: a planned step");
    if (!dropped_) return kept_;
    return run_->rebuild(entry_);
  }

 private:
  std::shared_ptr<StepRun> run_;
  int64_t entry_ = 0;
  bool dropped_ = false;
  at::Tensor kept_;
  c10::VariableVersion counter_;
  uint32_t version_ = 0;
  SavedEntry described_;  // its shape and dtype, for the error
};

}  // namespace

struct PlannedStep::State {
  Budget budget;
  PlannedStepOptions options;
  std::shared_ptr<RecordedStep> record;  // being completed by its backward, or planned
  std::shared_ptr<const RunPlan> run_plan;
  std::optional<StepPlan> plan;
  bool last_recorded = false;
  bool last_differed = false;
  bool warned = false;
  bool record_next = true;

  void make_plan() {
    const auto start = std::chrono::steady_clock::now();
    const RecordedStep& step = *record;
    const int64_t budget_bytes = budget.to_bytes(step.measured_peak);
    detail::GraphPlanChoice choice = detail::plan_drops(step, budget_bytes);
    auto made = std::make_shared<RunPlan>();
    made->step = record;
    made->rebuilds = detail::rebuilds_of(step, choice.drops);
    made->drops = std::move(choice.drops);
    StepPlan summary;
    summary.budget_bytes = budget_bytes;
    summary.unchecked_peak_bytes = step.measured_peak;
    summary.predicted_peak_bytes = choice.simulation.peak;
    summary.predicted_recompute_seconds = choice.simulation.recompute_seconds;
    summary.recorded_step_seconds = step.step_seconds;
    summary.calls = static_cast<int64_t>(step.calls.size());
    summary.saved_tensors = static_cast<int64_t>(step.saved.size());
    summary.candidates = choice.candidates;
    summary.search = choice.search;
    for (size_t s = 0; s < step.storages.size(); ++s) {
      const auto& storage = step.storages[s];
      if (!storage.outside && !storage.saved.empty()) ++summary.storages;
      if (made->drops.dropped[s]) {
        ++summary.dropped;
        summary.dropped_bytes += storage.bytes;
      }
    }
    for (bool r : made->rebuilds.replayed) summary.replayed_calls += r ? 1 : 0;
    summary.plan_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    run_plan = std::move(made);
    plan = summary;
  }
};

std::string StepPlan::to_string() const {
  std::ostringstream out;
  out << "step plan: budget " << mib(budget_bytes) << " (unplanned peak " << mib(unchecked_peak_bytes)
      << "), predicted peak " << mib(predicted_peak_bytes) << ", recompute " << predicted_recompute_seconds * 1e3
      << " ms\n"
      << "  " << calls << " operator calls, " << saved_tensors << " saved tensors in " << storages << " memory blocks ("
      << candidates << " can be rebuilt); dropped " << dropped << " (" << mib(dropped_bytes)
      << "), rebuilt by replaying " << replayed_calls << " calls; planned in " << plan_seconds * 1e3 << " ms"
      << (search.empty() ? "" : " (found by " + search + ")") << "\n";
  return out.str();
}

PlannedStep::PlannedStep(Budget budget, PlannedStepOptions options)
    : state_(std::make_unique<State>(State{std::move(budget), options, {}, {}, {}, false, false, false, true})) {
  install_cpu_memory_tracker();
}

PlannedStep::~PlannedStep() = default;
PlannedStep::PlannedStep(PlannedStep&&) noexcept = default;
PlannedStep& PlannedStep::operator=(PlannedStep&&) noexcept = default;

at::Tensor PlannedStep::run(const std::function<at::Tensor()>& forward) {
  State& s = *state_;
  s.last_differed = false;
  if (s.record && s.record_next) {
    if (s.record->complete()) {
      s.make_plan();
      s.record_next = false;
    }
    s.record.reset();
  }
  if (s.record_next || !s.run_plan) {
    s.last_recorded = true;
    s.record_next = true;
    return detail::record_step(forward, s.record, s.options.device());
  }
  s.last_recorded = false;
  auto run = std::make_shared<StepRun>(s.run_plan);
  at::Tensor loss;
  {
    detail::SavedTensorHooksScope hooks(
        [&] { return std::unique_ptr<torch::autograd::SavedVariableHooks>(new PlannedHooks(run)); });
    detail::ObservedCalls observed(*run);
    loss = forward();
  }
  if (!run->differed && run->next_call != static_cast<int64_t>(s.run_plan->step->calls.size())) {
    run->differ("it made " + std::to_string(run->next_call) + " operator calls, the recorded step " +
                std::to_string(s.run_plan->step->calls.size()));
  }
  if (run->differed) {
    s.last_differed = true;
    if (!s.warned) {
      TORCH_WARN("remat: a planned step differed from the recorded one (", run->difference,
                 "); it ran unplanned from there",
                 s.options.record_again_on_change() ? ", and the next step is recorded and planned again." : ".");
      s.warned = true;
    }
    if (s.options.record_again_on_change()) s.record_next = true;
  }
  return loss;
}

const StepPlan& PlannedStep::plan_now() {
  State& s = *state_;
  REMAT_CHECK(s.record && s.record_next && s.record->complete(),
              "PlannedStep::plan_now() needs a recorded step whose backward has run: call run(forward), then "
              "backward on its loss, first.");
  s.make_plan();
  s.record_next = false;
  s.record.reset();
  return *s.plan;
}

bool PlannedStep::planned() const { return state_->plan.has_value(); }

const StepPlan& PlannedStep::plan() const {
  REMAT_CHECK(state_->plan.has_value(),
              "remat: PlannedStep::plan() before a plan exists: the first run records the step, and the run after "
              "its backward plans it.");
  return *state_->plan;
}

bool PlannedStep::last_run_recorded() const { return state_->last_recorded; }
bool PlannedStep::last_run_differed() const { return state_->last_differed; }

}  // namespace remat
