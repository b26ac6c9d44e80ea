#include "remat/checkpoint/checkpoint.h"

#include <ostream>

#include <c10/core/GradMode.h>

#include "checkpoint/checkpoint_modes.h"
#include "checkpoint/operator_log.h"
#include "checkpoint/recompute_state.h"
#include "remat/base/error.h"
#include "remat/base/threads.h"

namespace remat {
namespace detail {

namespace {
thread_local bool recomputing_graph_only_flag = false;
}  // namespace

bool recomputing_graph_only() { return recomputing_graph_only_flag; }

RecomputingGraphOnlyScope::RecomputingGraphOnlyScope(bool value) : previous_(recomputing_graph_only_flag) {
  recomputing_graph_only_flag = value;
}

RecomputingGraphOnlyScope::~RecomputingGraphOnlyScope() { recomputing_graph_only_flag = previous_; }

std::string describe_input_use(const std::string& name) { return "checkpoint '" + name + "': "; }

void check_outputs(const std::vector<at::Tensor>& outputs, const std::string& name) {
  bool any_defined = false;
  for (const auto& t : outputs) any_defined = any_defined || t.defined();
  REMAT_CHECK(any_defined, describe_input_use(name),
              "the function returned no tensor; a checkpointed function must return at least one "
              "defined tensor.");
}

}  // namespace detail

namespace {
using detail::check_outputs;
using detail::checkpoint_non_reentrant;
using detail::checkpoint_reentrant;
using detail::describe_input_use;
}  // namespace

namespace {
thread_local CheckpointMode default_mode = CheckpointMode::non_reentrant;
}  // namespace

CheckpointMode default_checkpoint_mode() { return default_mode; }

const char* to_string(CheckpointMode mode) { return mode == CheckpointMode::reentrant ? "reentrant" : "non-reentrant"; }

std::ostream& operator<<(std::ostream& out, CheckpointMode mode) { return out << to_string(mode); }

CheckpointMode parse_checkpoint_mode(const std::string& text) {
  if (text == "reentrant") return CheckpointMode::reentrant;
  if (text == "non-reentrant") return CheckpointMode::non_reentrant;
  REMAT_CHECK(false, "unknown checkpoint mode '", text, "'; use reentrant or non-reentrant.");
  return CheckpointMode::reentrant;
}

CheckpointModeGuard::CheckpointModeGuard(CheckpointMode mode) : previous_(default_mode) { default_mode = mode; }

CheckpointModeGuard::~CheckpointModeGuard() { default_mode = previous_; }

namespace detail {

std::vector<at::Tensor> checkpoint_function(const TensorListFunction& fn, const std::vector<at::Tensor>& inputs,
                                            const CheckpointOptions& options) {
  warn_if_threads_oversubscribed();
  REMAT_CHECK(static_cast<bool>(fn), describe_input_use(options.name()), "the function is empty.");
  REMAT_CHECK(!detail::inside_selective_policy(), describe_input_use(options.name()),
              "called from inside a selective policy. A policy decides what to keep from the call it is given; "
              "it may compute with tensors, but must not run a checkpoint.");
  REMAT_CHECK(!inputs.empty(), describe_input_use(options.name()),
              "inputs is empty; pass the tensors the function computes from (its activations), so "
              "they can be kept for the recompute.");
  // This call's outputs are real values, whatever encloses it (a recompute, for a nested checkpoint).
  detail::RecomputingGraphOnlyScope values_needed(false);
  // A checkpoint nested in an intercepted function is one step of it: its calls are its own.
  detail::HiddenFromEnclosingLog hidden;
  std::vector<at::Tensor> outputs;
  if (!c10::GradMode::is_enabled()) {
    outputs = fn(inputs);
    check_outputs(outputs, options.name());
  } else if (options.effective_mode() == CheckpointMode::non_reentrant) {
    outputs = checkpoint_non_reentrant(fn, inputs, options);
  } else {
    outputs = checkpoint_reentrant(fn, inputs, options);
  }
  hidden.outputs_created(outputs);
  return outputs;
}

at::Tensor checkpoint_function(const TensorFunction& fn, const at::Tensor& input, const CheckpointOptions& options) {
  REMAT_CHECK(static_cast<bool>(fn), describe_input_use(options.name()), "the function is empty.");
  auto outputs = checkpoint_function(
      TensorListFunction([fn](const std::vector<at::Tensor>& xs) { return std::vector<at::Tensor>{fn(xs[0])}; }),
      std::vector<at::Tensor>{input}, options);
  return outputs[0];
}

}  // namespace detail

}  // namespace remat
