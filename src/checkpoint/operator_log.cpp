#include "checkpoint/operator_log.h"

#include <algorithm>
#include <mutex>
#include <ostream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/clone.h>
#include <ATen/ops/equal.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "checkpoint/checkpoint_modes.h"
#include "checkpoint/forward_state.h"
#include "base/tensor_text.h"
#include "remat/base/error.h"

namespace remat::detail {

namespace {

constexpr c10::DispatchKey kInterceptKey = c10::DispatchKey::Fake;

using SchemaFacts = OperatorFacts;

// Operators that write an argument their schema does not mark as written (LibTorch 1.13's schemas
// lack some annotations that later versions added): argument positions by operator name.
const std::vector<size_t>* unmarked_writes(const std::string& name) {
  static const std::unordered_map<std::string, std::vector<size_t>> known = {
      {"aten::rrelu_with_noise", {1}},  // writes the noise it draws (marked `Tensor(a!) noise` since 2.4)
      // Running statistics, written below the version counter (marked in 2.x's _native_batch_norm_legit).
      {"aten::native_batch_norm", {3, 4}},
      {"aten::cudnn_batch_norm", {3, 4}},
      {"aten::miopen_batch_norm", {3, 4}},
  };
  auto found = known.find(name);
  return found == known.end() ? nullptr : &found->second;
}

const SchemaFacts& facts_of(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  thread_local std::unordered_map<const c10::FunctionSchema*, SchemaFacts> known;
  auto found = known.find(&schema);
  if (found != known.end()) return found->second;
  SchemaFacts facts;
  const auto& arguments = schema.arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    const std::string type = arguments[i].type()->str();
    if (type.find("Generator") != std::string::npos) facts.random = facts.takes_generator = true;
    const c10::AliasInfo* alias = arguments[i].alias_info();
    if (alias != nullptr && alias->isWrite()) facts.written.push_back(i);
  }
  if (const auto* more = unmarked_writes(schema.name())) {
    for (size_t i : *more) {
      if (i < arguments.size() && std::find(facts.written.begin(), facts.written.end(), i) == facts.written.end()) {
        facts.written.push_back(i);
      }
    }
  }
  // The tag is what PyTorch's own selective checkpointing reads: rand_like, randn, randperm, ... draw
  // from the default generator and take none as an argument.
  facts.random = facts.random || op.hasTag(at::Tag::nondeterministic_seeded) || schema.name() == "aten::native_dropout";
  for (const auto& result : schema.returns())
    facts.returns_alias = facts.returns_alias || result.alias_info() != nullptr;
  return known.emplace(&schema, std::move(facts)).first->second;
}

template <typename F>
void for_each_tensor(c10::ArrayRef<c10::IValue> values, F&& f) {
  for (const c10::IValue& value : values) {
    if (value.isTensor()) {
      f(value.toTensor());
    } else if (value.isTensorList()) {
      const c10::List<at::Tensor> list = value.toTensorList();
      for (size_t i = 0; i < list.size(); ++i) f(list.get(i));  // get(): a tensor, not a reference to a temporary
    } else if (value.isList()) {
      for (const c10::IValue& element : value.toListRef()) {
        if (element.isTensor()) f(element.toTensor());
      }
    }
  }
}

struct KeptTensor {
  at::Tensor value;
  c10::VariableVersion counter;  // the forward's result's: a change in place shows here
  uint32_t version;
  bool private_copy = false;  // copied before the forward changed the result in place (or undefined)
};

struct Read {
  size_t position;  // among the call's tensor arguments
  at::Tensor tensor;
  uint32_t version;
};

// The form of one kept result; its tensors are the call's KeptTensors, in order. The forward's own
// result tensors are not held: after a copy before a write they would keep the changed storage.
struct KeptResult {
  enum Kind { tensor, tensor_list, value } kind = value;
  size_t count = 1;
  c10::IValue other;  // a result that is not a tensor
};

struct Call {
  const c10::FunctionSchema* schema;
  bool keeps = false;
  std::vector<KeptResult> results;
  std::vector<KeptTensor> kept;          // the kept results' tensors
  c10::optional<RngSnapshot> rng_after;  // a kept random call: where the forward left the RNG
  std::vector<Read> reads;
};

std::string call_text(const c10::FunctionSchema& schema) {
  const auto& name = schema.operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

std::string describe(const at::Tensor& t) {
  const c10::Device device = t.device();
  return tensor_text(t.sizes(), t.scalar_type(), &device);
}

}  // namespace

struct OperatorLog::State {
  SelectivePolicy policy;
  bool check_reads = false;
  std::string name;
  bool preserve_rng = false;
  RngSnapshot rng_like;  // which generators a kept random call records
  std::vector<Call> calls;
  std::vector<size_t> keeping;  // calls whose kept tensors are not private copies
  std::unordered_map<std::string, int64_t> name_counts;
  bool released = false;
  // Tensors from outside the function that it changes in place (running statistics): where each
  // was first written, for messages; the recompute writes them again and restores them after.
  struct Written {
    at::Tensor tensor;
    size_t call;
  };
  std::vector<Written> written_captured;
  std::unordered_map<const c10::TensorImpl*, size_t> written_index;  // into written_captured: read per call

  std::string prefix() const { return describe_input_use(name); }
};

namespace {

// One intercepting scope on this thread: a Recording or a Replaying.
struct Interception {
  OperatorLog::State* log = nullptr;
  bool replay = false;
  bool use_kept = false;
  size_t next = 0;
  // Made by the function (recording): its results, and the storages of results that own a storage
  // of their own (a factory like torch::empty_like wraps its result in another TensorImpl).
  std::unordered_set<const c10::TensorImpl*> created;
  std::unordered_set<const c10::StorageImpl*> created_storages;
  bool made_by_function(const at::Tensor& t) const {
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    if (created.count(impl) != 0) return true;
    return impl->has_storage() && created_storages.count(t.storage().unsafeGetStorageImpl()) != 0;
  }
  Interception* previous = nullptr;
  c10::impl::LocalDispatchKeySet saved_keys = c10::impl::tls_local_dispatch_key_set();
  bool saved_autocast_cache = at::autocast::is_autocast_cache_enabled();
};

thread_local Interception* active = nullptr;
// The recording scopes on this thread, innermost last, also those a nested checkpoint hides from:
// a captured tensor an inner function writes is written by every enclosing function too.
thread_local std::vector<Interception*> recording;
thread_local bool inside_checkpoint_forward = false;
thread_local bool inside_policy = false;

void set_intercepting(bool on) {
  c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
  if (on) {
    keys.included_ = keys.included_.add(kInterceptKey);
    keys.excluded_ = keys.excluded_.remove(kInterceptKey);
  } else {
    keys.included_ = keys.included_.remove(kInterceptKey);
  }
  c10::impl::_force_tls_local_dispatch_key_set(keys);
}

void run_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard hidden(kInterceptKey);  // calls the kernel makes are its own
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kInterceptKey), stack);
}

// Copies every kept tensor that `written` aliases, before the call writes it.
void copy_kept_before_write(OperatorLog::State& log, const at::Tensor& written) {
  if (!written.defined()) return;
  for (size_t k = 0; k < log.keeping.size();) {
    Call& call = log.calls[log.keeping[k]];
    bool any_shared = false;
    for (KeptTensor& kept : call.kept) {
      if (kept.private_copy || !kept.value.is_alias_of(written)) continue;
      c10::impl::ExcludeDispatchKeyGuard hidden(kInterceptKey);
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      kept.value = at::clone(kept.value).variable_data();
      kept.private_copy = true;
    }
    for (const KeptTensor& kept : call.kept) any_shared = any_shared || !kept.private_copy;
    if (any_shared) {
      ++k;
    } else {
      log.keeping.erase(log.keeping.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
}

const OperatorLog::State::Written* written_by_function(const OperatorLog::State& log, const at::Tensor& t) {
  if (log.written_index.empty()) return nullptr;
  const auto found = log.written_index.find(t.unsafeGetTensorImpl());
  return found == log.written_index.end() ? nullptr : &log.written_captured[found->second];
}

// Notes, in this scope and every enclosing recording one, that the function changes a tensor from
// outside it in place.
void note_write(const at::Tensor& t, size_t call_index) {
  if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return;
  for (auto s = recording.rbegin(); s != recording.rend(); ++s) {
    if ((*s)->made_by_function(t)) return;
    OperatorLog::State& log = *(*s)->log;
    if (log.written_index.emplace(t.unsafeGetTensorImpl(), log.written_captured.size()).second) {
      log.written_captured.push_back({t, *s == recording.back() ? call_index : log.calls.size()});
    }
  }
}

// Notes the tensors the call reads from outside the function (check_reads). A tensor the call
// changes in place is state the function updates (running statistics, restored after the
// recompute), not a value it reads: its version moves by design. But a value the function reads
// after changing it cannot be recomputed (the recompute would change it once more first).
void note_reads(const Interception& scope, const SchemaFacts& facts, c10::ArrayRef<c10::IValue> arguments, Call& call,
                const c10::FunctionSchema& schema) {
  const OperatorLog::State& log = *scope.log;
  size_t position = 0;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const bool written = std::find(facts.written.begin(), facts.written.end(), i) != facts.written.end();
    for_each_tensor(arguments.slice(i, 1), [&](const at::Tensor& t) {
      const size_t here = position++;
      if (written || !t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return;
      if (scope.made_by_function(t)) return;
      if (const auto* w = written_by_function(log, t)) {
        REMAT_CHECK(false, log.prefix(), "the function changes a ", describe(t),
                    " tensor from outside it in place (operator call ", w->call, ") and then reads it (",
                    call_text(schema), ", operator call ", log.calls.size(),
                    "): its recompute would change it once more and compute with other values, giving wrong "
                    "gradients. Change a copy inside the function (`w.clone().add_(1)`), or change it outside "
                    "the checkpoint.");
      }
      const auto& counter = t.unsafeGetTensorImpl()->version_counter();
      call.reads.push_back({here, t, counter.enabled() ? counter.current_version() : 0});
    });
  }
}

bool is_keep(CheckpointPolicy decision) {
  return decision == CheckpointPolicy::must_save || decision == CheckpointPolicy::prefer_save;
}

// The policy runs as user code outside the function: its own tensor operations are plain calls,
// not calls of the function (interception paused), and a checkpoint inside it is refused
// (checkpoint() asks inside_selective_policy()).
CheckpointPolicy run_policy(const OperatorLog::State& log, const c10::FunctionSchema& schema,
                            const OperatorCall& seen) {
  struct PolicyScope {
    HiddenFromEnclosingLog hidden;  // the policy's own calls are not the function's
    bool was_inside = std::exchange(inside_policy, true);
    ~PolicyScope() { inside_policy = was_inside; }
  };
  CheckpointPolicy decision;
  try {
    PolicyScope scope;
    decision = log.policy(seen);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    REMAT_CHECK(false, log.prefix(), "the selective policy threw while deciding ", call_text(schema),
                " (operator call ", seen.index, "): ", what.substr(0, what.find('\n')));
  }
  const auto value = static_cast<int>(decision);
  REMAT_CHECK(value >= static_cast<int>(CheckpointPolicy::must_save) &&
                  value <= static_cast<int>(CheckpointPolicy::prefer_recompute),
              log.prefix(), "the selective policy returned CheckpointPolicy(", value, ") for ", call_text(schema),
              " (operator call ", seen.index,
              "), which is none of must_save, prefer_save, must_recompute, prefer_recompute.");
  return decision;
}

// Asks the policy, then decides what can be done. A call that writes an argument is never kept
// (its recompute must write it again): must_save on one is refused, naming the argument. A call
// that returns a view of an argument is recomputed whatever the policy says: keeping a view would
// keep its base, and recomputing one costs nothing.
CheckpointPolicy ask_policy(OperatorLog::State& log, const c10::FunctionSchema& schema, const SchemaFacts& facts,
                            c10::ArrayRef<c10::IValue> arguments, int64_t index) {
  const std::string& name = schema.name();
  OperatorCall seen;
  seen.name = name;
  seen.overload = schema.overload_name();
  seen.index = index;
  seen.name_index = log.name_counts[name]++;
  seen.random = facts.random;
  seen.writes = !facts.written.empty();
  seen.returns_view = facts.returns_alias && facts.written.empty();
  seen.arguments = arguments;
  const CheckpointPolicy decision = run_policy(log, schema, seen);
  if (!is_keep(decision)) return decision;
  if (!facts.written.empty()) {
    REMAT_CHECK(decision != CheckpointPolicy::must_save, log.prefix(), "the selective policy returned must_save for ",
                call_text(schema), " (operator call ", index, "), which writes its argument '",
                schema.arguments()[facts.written.front()].name(),
                "' in place: its recompute must write it again, so its result cannot be kept. Return prefer_save "
                "(kept where it can be) or a recompute policy for such calls; OperatorCall::writes tells them.");
    return CheckpointPolicy::prefer_recompute;
  }
  return facts.returns_alias ? CheckpointPolicy::prefer_recompute : decision;
}

// Keeps the call's results (as tensors of the log's own), unless a kernel returned an argument's
// storage under a schema that says nothing (_unsafe_view): such a result cannot be kept apart.
void keep_results(OperatorLog::State& log, const SchemaFacts& facts, c10::ArrayRef<c10::IValue> results,
                  const std::vector<at::Tensor>& argument_tensors, Call& call) {
  bool shares_argument = false;
  for_each_tensor(results, [&](const at::Tensor& r) {
    for (const at::Tensor& a : argument_tensors)
      shares_argument = shares_argument || (r.defined() && a.defined() && r.is_alias_of(a));
  });
  if (shares_argument) return;  // a view the schema does not declare: recomputed, as declared views are
  call.keeps = true;
  for (const c10::IValue& result : results) {
    KeptResult shape;
    if (result.isTensor()) {
      shape.kind = KeptResult::tensor;
    } else if (result.isTensorList()) {
      shape.kind = KeptResult::tensor_list;
      shape.count = result.toTensorList().size();
    } else {
      shape.other = result;
    }
    call.results.push_back(std::move(shape));
    for_each_tensor(c10::ArrayRef<c10::IValue>(&result, 1), [&](const at::Tensor& t) {
      if (!t.defined()) return call.kept.push_back({t, c10::VariableVersion(), 0, true});
      const auto& counter = t.unsafeGetTensorImpl()->version_counter();
      call.kept.push_back({t.variable_data(), counter, counter.enabled() ? counter.current_version() : 0, false});
    });
  }
  if (facts.random && log.preserve_rng) call.rng_after = RngSnapshot::capture_like(log.rng_like);
  log.keeping.push_back(log.calls.size());
}

void record(Interception& scope, const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  OperatorLog::State& log = *scope.log;
  const c10::FunctionSchema& schema = op.schema();
  const SchemaFacts& facts = facts_of(op);
  const size_t num_arguments = schema.arguments().size();
  const c10::ArrayRef<c10::IValue> arguments(stack->data() + stack->size() - num_arguments, num_arguments);
  Call call;
  call.schema = &schema;
  if (log.check_reads) note_reads(scope, facts, arguments, call, schema);
  for (size_t i : facts.written) {
    for_each_tensor(arguments.slice(i, 1), [&](const at::Tensor& t) {
      note_write(t, log.calls.size());
      if (!log.keeping.empty()) copy_kept_before_write(log, t);
    });
  }
  CheckpointPolicy decision = CheckpointPolicy::prefer_recompute;
  std::vector<at::Tensor> argument_tensors;  // of a call to keep: its results must not share them
  if (log.policy) {
    decision = ask_policy(log, schema, facts, arguments, static_cast<int64_t>(log.calls.size()));
    if (is_keep(decision)) {
      for_each_tensor(arguments, [&](const at::Tensor& t) { argument_tensors.push_back(t); });
    }
  }
  std::vector<const c10::TensorImpl*> argument_impls;
  std::vector<const c10::StorageImpl*> argument_storages;
  for_each_tensor(arguments, [&](const at::Tensor& t) {
    if (!t.defined()) return;
    argument_impls.push_back(t.unsafeGetTensorImpl());
    if (t.has_storage()) argument_storages.push_back(t.storage().unsafeGetStorageImpl());
  });
  run_kernel(op, keys, stack);
  const size_t num_results = schema.returns().size();
  const c10::ArrayRef<c10::IValue> results(stack->data() + stack->size() - num_results, num_results);
  // A result that is an argument itself (`w.add_(1)` returns w) stays what it was.
  for_each_tensor(results, [&](const at::Tensor& t) {
    if (!t.defined()) return;
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    if (std::find(argument_impls.begin(), argument_impls.end(), impl) == argument_impls.end()) {
      scope.created.insert(impl);
    }
    if (!t.has_storage()) return;
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    if (std::find(argument_storages.begin(), argument_storages.end(), storage) == argument_storages.end()) {
      scope.created_storages.insert(storage);
    }
  });
  if (is_keep(decision)) keep_results(log, facts, results, argument_tensors, call);
  log.calls.push_back(std::move(call));
}

// Where a replayed call is, for messages: built only when one is thrown.
struct ReplayedCall {
  const OperatorLog::State& log;
  const Call& call;
  size_t index;
};

std::ostream& operator<<(std::ostream& out, const ReplayedCall& at) {
  return out << at.log.prefix() << "the recompute's call of " << call_text(*at.call.schema) << " (operator call "
             << at.index << ") ";
}

void check_reads(const OperatorLog::State& log, const Call& call, size_t index, c10::ArrayRef<c10::IValue> arguments) {
  std::vector<at::Tensor> now;
  for_each_tensor(arguments, [&](const at::Tensor& t) { now.push_back(t); });
  for (const Read& read : call.reads) {
    const ReplayedCall where{log, call, index};
    REMAT_CHECK(read.position < now.size(), where, "has fewer tensor arguments than the forward's call.");
    const at::Tensor& t = now[read.position];
    if (t.unsafeGetTensorImpl() == read.tensor.unsafeGetTensorImpl()) {
      const auto& counter = t.unsafeGetTensorImpl()->version_counter();
      const uint32_t version = counter.enabled() ? counter.current_version() : 0;
      REMAT_CHECK(version == read.version, where, "reads a ", describe(t),
                  " tensor that the function captured (neither an input nor made by the function) and that was "
                  "modified in place after the forward (its version is ",
                  version, ", the forward read version ", read.version,
                  "): the recompute would compute with the new values and give wrong gradients. Change it only "
                  "after backward, or clone it before changing it.");
      continue;
    }
    bool same_values = false;
    if (t.defined() && t.sizes() == read.tensor.sizes() && t.scalar_type() == read.tensor.scalar_type() &&
        t.device() == read.tensor.device()) {
      c10::impl::ExcludeDispatchKeyGuard hidden(kInterceptKey);
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      same_values = at::equal(t, read.tensor);
    }
    REMAT_CHECK(same_values, where, "reads a ", t.defined() ? describe(t) : std::string("undefined"),
                " tensor where the forward's call read another ", describe(read.tensor),
                " tensor, with other values, from outside the function (a captured variable rebound after the "
                "forward, as in `w = w + 1`): the recompute would compute with it and give wrong gradients. "
                "Capture tensors by value, or change what the function reads only after backward.");
  }
}

void replay(Interception& scope, const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  OperatorLog::State& log = *scope.log;
  const c10::FunctionSchema& schema = op.schema();
  const size_t index = scope.next++;
  REMAT_CHECK(index < log.calls.size(), log.prefix(), "the recompute made more operator calls than the forward's ",
              log.calls.size(), " (call ", index, " is ", call_text(schema),
              "). The function must make the same operator calls when re-run: no code that depends on data or "
              "on state changed since the forward.");
  const Call& call = log.calls[index];
  REMAT_CHECK(call.schema == &schema, log.prefix(), "the recompute's operator call ", index, " is ", call_text(schema),
              " but the forward's was ", call_text(*call.schema),
              ". The function must make the same operator calls when re-run: no code that depends on data or on "
              "state changed since the forward.");
  const size_t num_arguments = schema.arguments().size();
  if (!call.reads.empty()) {
    check_reads(log, call, index,
                c10::ArrayRef<c10::IValue>(stack->data() + stack->size() - num_arguments, num_arguments));
  }
  // A kept result changed in place where remat could not copy it first (after the forward, or in a
  // checkpoint nested in the function) no longer holds the call's value: the call runs again, from
  // inputs the checks above vouch for, and draws what it drew (the RNG is where the forward's was).
  bool stale = false;
  for (const KeptTensor& kept : call.kept) {
    stale = stale || (!kept.private_copy && kept.counter.enabled() && kept.counter.current_version() != kept.version);
  }
  if (!call.keeps || !scope.use_kept || stale) {
    run_kernel(op, keys, stack);
    return;
  }
  torch::jit::drop(*stack, num_arguments);
  size_t k = 0;
  auto next_tensor = [&] {
    const at::Tensor& t = call.kept[k++].value;
    return t.defined() ? t.variable_data() : t;
  };
  for (const KeptResult& result : call.results) {
    if (result.kind == KeptResult::tensor) {
      stack->push_back(next_tensor());
    } else if (result.kind == KeptResult::tensor_list) {
      c10::List<at::Tensor> list;
      for (size_t i = 0; i < result.count; ++i) list.push_back(next_tensor());
      stack->push_back(std::move(list));
    } else {
      stack->push_back(result.other);
    }
  }
  if (call.rng_after) call.rng_after->restore();
}

thread_local CallObserver* observer = nullptr;

void intercept(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  Interception* scope = active;
  if (scope == nullptr) {
    if (observer != nullptr) return observer->on_call(op, keys, stack);
    return run_kernel(op, keys, stack);
  }
  if (scope->replay) return replay(*scope, op, keys, stack);
  record(*scope, op, keys, stack);
}

void register_interception_once() {
  static std::once_flag once;
  static std::unique_ptr<torch::Library> library;
  static std::string failure;
  std::call_once(once, [] {
    try {
      library = std::make_unique<torch::Library>(torch::Library::IMPL, "_", kInterceptKey, __FILE__, __LINE__);
      library->fallback(torch::CppFunction::makeFromBoxedFunction<&intercept>());
    } catch (const std::exception& e) {
      failure = e.what();
      failure = failure.substr(0, failure.find('\n'));
    }
  });
  REMAT_CHECK(
      failure.empty(),
      "selective checkpointing, CheckpointOptions::check_reads and step planning see operator calls through LibTorch's "
      "dispatch key Fake, but registering remat's handler for it failed (another library in this process "
      "registered one first?): ",
      failure, ". Use checkpoints without a selective policy and without check_reads, and plan chains, here.");
}

void enter(Interception& scope, OperatorLog::State* log, bool replay, bool use_kept,
           const std::vector<at::Tensor>& inputs) {
  register_interception_once();
  scope.log = log;
  scope.replay = replay;
  scope.use_kept = use_kept;
  if (!replay) {
    for (const auto& t : inputs) {
      if (t.defined()) scope.created.insert(t.unsafeGetTensorImpl());
    }
    recording.push_back(&scope);
  }
  scope.previous = active;
  active = &scope;
  // Autocast's cache of cast weights would make the recompute skip casts its forward made.
  at::autocast::set_autocast_cache_enabled(false);
  set_intercepting(true);
}

void leave(Interception& scope) {
  if (!scope.replay) recording.erase(std::find(recording.begin(), recording.end(), &scope));
  c10::impl::_force_tls_local_dispatch_key_set(scope.saved_keys);
  at::autocast::set_autocast_cache_enabled(scope.saved_autocast_cache);
  active = scope.previous;
}

}  // namespace

OperatorLog::OperatorLog(const CheckpointOptions& options, const std::vector<at::Tensor>& inputs)
    : state_(std::make_unique<State>()) {
  if (!inside_checkpoint_forward) state_->policy = options.selective();
  state_->check_reads = options.effective_check_reads();
  state_->name = options.name();
  state_->preserve_rng = options.preserve_rng_state();
  if (state_->preserve_rng && state_->policy) {
    const RngSnapshot now = RngSnapshot::capture(inputs);
    state_->rng_like = now.with_tensors(std::vector<at::Tensor>(now.tensors().size()));  // the devices, not the states
  }
}

OperatorLog::~OperatorLog() = default;

bool OperatorLog::wanted(const CheckpointOptions& options) {
  return options.effective_check_reads() || (options.selective() && !inside_checkpoint_forward);
}

std::vector<at::Tensor> OperatorLog::restored_after_recompute(const std::vector<at::Tensor>& listed) const {
  std::vector<at::Tensor> all = listed;
  for (const auto& w : state_->written_captured) {
    bool seen = false;
    for (const auto& t : all) seen = seen || (t.defined() && t.unsafeGetTensorImpl() == w.tensor.unsafeGetTensorImpl());
    if (!seen) all.push_back(w.tensor);
  }
  return all;
}

int64_t OperatorLog::kept_bytes() const {
  std::unordered_set<const void*> storages;
  int64_t bytes = 0;
  for (const Call& call : state_->calls) {
    for (const KeptTensor& kept : call.kept) {
      if (!kept.value.defined() || !kept.value.has_storage()) continue;
      const auto& storage = kept.value.storage();
      if (storages.insert(storage.unsafeGetStorageImpl()).second) bytes += static_cast<int64_t>(storage.nbytes());
    }
  }
  return bytes;
}

struct OperatorLog::Recording::Scope : Interception {};
struct OperatorLog::Replaying::Scope : Interception {};

OperatorLog::Recording::Recording(OperatorLog& log, const std::vector<at::Tensor>& inputs)
    : scope_(std::make_unique<Scope>()) {
  enter(*scope_, log.state_.get(), /*replay=*/false, /*use_kept=*/false, inputs);
}

OperatorLog::Recording::~Recording() { leave(*scope_); }

OperatorLog::Replaying::Replaying(OperatorLog& log, const std::vector<at::Tensor>& inputs, bool release)
    : scope_(std::make_unique<Scope>()), release_(release) {
  enter(*scope_, log.state_.get(), /*replay=*/true, /*use_kept=*/!log.state_->released, inputs);
}

OperatorLog::Replaying::~Replaying() {
  leave(*scope_);
  if (!scope_->use_kept || !release_) return;
  // Kept results serve one recompute: a second backward recomputes every call.
  State& log = *scope_->log;
  for (Call& call : log.calls) {
    call.results.clear();
    call.kept.clear();
    call.rng_after.reset();
  }
  log.keeping.clear();
  log.released = true;
}

void OperatorLog::Replaying::check_complete() const {
  const State& log = *scope_->log;
  REMAT_CHECK(scope_->next == log.calls.size(), log.prefix(), "the recompute made ", scope_->next,
              " operator calls but the forward made ", log.calls.size(),
              ". The function must make the same operator calls when re-run: no code that depends on data or on "
              "state changed since the forward.");
}

HiddenFromEnclosingLog::HiddenFromEnclosingLog()
    : enclosing_(active), saved_keys_(c10::impl::tls_local_dispatch_key_set()) {
  if (enclosing_ == nullptr) return;
  active = nullptr;
  set_intercepting(false);
}

HiddenFromEnclosingLog::~HiddenFromEnclosingLog() {
  if (enclosing_ == nullptr) return;
  active = static_cast<Interception*>(enclosing_);
  c10::impl::_force_tls_local_dispatch_key_set(saved_keys_);
}

void HiddenFromEnclosingLog::outputs_created(const std::vector<at::Tensor>& outputs) {
  auto* enclosing = static_cast<Interception*>(enclosing_);
  if (enclosing == nullptr || enclosing->replay) return;
  for (const auto& t : outputs) {
    if (t.defined()) enclosing->created.insert(t.unsafeGetTensorImpl());
  }
}

const OperatorFacts& operator_facts(const c10::OperatorHandle& op) { return facts_of(op); }

void CallObserver::run_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  detail::run_kernel(op, keys, stack);
}

ObservedCalls::ObservedCalls(CallObserver& observer)
    : previous_(detail::observer), saved_keys_(c10::impl::tls_local_dispatch_key_set()) {
  register_interception_once();
  detail::observer = &observer;
  set_intercepting(true);
}

ObservedCalls::~ObservedCalls() {
  c10::impl::_force_tls_local_dispatch_key_set(saved_keys_);
  detail::observer = previous_;
}

bool inside_selective_policy() { return inside_policy; }

CheckpointForwardScope::CheckpointForwardScope(bool forward) : previous_(inside_checkpoint_forward) {
  inside_checkpoint_forward = forward;
}

CheckpointForwardScope::~CheckpointForwardScope() { inside_checkpoint_forward = previous_; }

}  // namespace remat::detail
