// Reentrant mode: one autograd Function for the whole checkpointed function; its backward
// recomputes the function and differentiates the recomputed graph.
#include <sstream>
#include <unordered_set>

#include <ATen/SequenceNumber.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/basic_ops.h>

#include "checkpoint/checkpoint_modes.h"
#include "base/tensor_text.h"
#include "checkpoint/forward_state.h"
#include "checkpoint/operator_log.h"
#include "checkpoint/recompute_state.h"
#include "checkpoint/saved_versions.h"
#include "base/torch_compat.h"
#include "remat/checkpoint/checkpoint.h"
#include "remat/base/error.h"
#include "remat/memory/memory_timeline.h"

namespace remat {

namespace {

using detail::check_outputs;
using detail::describe_input_use;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct OutputMeta {
  bool defined = false;
  bool requires_grad = false;
  std::vector<int64_t> sizes;
  at::ScalarType dtype = at::kFloat;
  c10::Device device = c10::kCPU;

  static OutputMeta of(const at::Tensor& t) {
    OutputMeta m;
    m.defined = t.defined();
    if (!m.defined) return m;
    m.requires_grad = t.requires_grad();
    m.sizes = t.sizes().vec();
    m.dtype = t.scalar_type();
    m.device = t.device();
    return m;
  }
};

// torch::autograd::grad(roots, wrt, root_grads), except that the roots are released before the
// engine runs: it needs their graph edges, not their data, and a recomputed segment's output would
// otherwise stay allocated through the segment's whole backward (for a residual block, one
// block-sized activation more than the forward ever held at that point).
variable_list grad_releasing_roots(variable_list&& roots, const variable_list& wrt, const variable_list& root_grads,
                                   bool create_graph) {
  torch::autograd::edge_list root_edges, wrt_edges;
  for (const auto& root : roots) root_edges.push_back(torch::autograd::impl::gradient_edge(root));
  roots.clear();
  for (const auto& input : wrt) {
    auto grad_fn = input.grad_fn();
    if (!grad_fn) grad_fn = torch::autograd::impl::try_get_grad_accumulator(input);
    if (grad_fn) {
      wrt_edges.emplace_back(std::move(grad_fn), input.output_nr());
    } else {  // not reached by the recompute: an undefined gradient, as grad(allow_unused=true) gives
      wrt_edges.emplace_back(detail::make_node<torch::autograd::Identity, torch::autograd::Edge>(), 0);
    }
  }
  // The gradients reach their hooks once, when the outer backward delivers them along the
  // checkpoint node's edges; the capture here must not fire them too (torch_compat.h).
  std::vector<torch::autograd::Node*> captured_nodes;
  for (const auto& edge : wrt_edges) captured_nodes.push_back(edge.function.get());
  return detail::run_with_capture_hooks_aside(captured_nodes, [&] {
    // With create_graph the gradients' own graph reaches into the recomputed graph (tanh's backward
    // reuses its saved output, ...): keep it, as torch::autograd::grad's retain_graph default does.
    return torch::autograd::Engine::get_default_engine().execute(root_edges, root_grads, /*keep_graph=*/create_graph,
                                                                 create_graph, /*accumulate_grad=*/false, wrt_edges);
  });
}

std::string describe(const OutputMeta& m) {
  if (!m.defined) return "undefined";
  return detail::tensor_text(m.sizes, m.dtype, &m.device);
}

// Everything the backward needs besides the saved tensors. Held by the autograd node, so it lives
// as long as the graph does; the inputs themselves are saved tensors, released after backward.
struct CheckpointState : torch::CustomClassHolder {
  TensorListFunction fn;
  CheckpointOptions options;
  size_t num_inputs = 0;
  std::vector<bool> input_defined;
  std::vector<bool> input_requires_grad;
  std::vector<OutputMeta> output_meta;
  // Which generators to restore; their state tensors are saved tensors of the node, so a backward
  // without retain_graph frees them with the inputs (not when the whole graph goes).
  detail::RngSnapshot rng;
  size_t num_rng_tensors = 0;
  detail::AutocastSnapshot autocast;
  detail::SavedVersions versions;            // of the inputs and of what the forward's operations saved
  variable_list forward_outputs;             // handed from checkpoint() to forward(), then released
  std::unique_ptr<detail::OperatorLog> log;  // the forward's operator calls (a policy, check_reads)
};

// Walks the graph `fn` recorded, from its outputs back to where it started, and returns the
// tensors it reached that require grad and were not inputs: the parameters `fn` uses. A node older
// than the recording means `fn` used a non-leaf tensor produced outside it, which cannot be
// recomputed from the inputs: it must be passed as an input.
std::vector<at::Tensor> find_used_parameters(const variable_list& outputs, const variable_list& own_inputs,
                                             uint64_t first_sequence_nr, const std::string& name) {
  std::unordered_set<const c10::TensorImpl*> inputs;
  for (const auto& t : own_inputs) {
    if (t.defined()) inputs.insert(t.unsafeGetTensorImpl());
  }
  std::unordered_set<const c10::TensorImpl*> found_set;
  std::vector<at::Tensor> found;
  auto add_leaf = [&](const at::Tensor& leaf) {
    if (inputs.count(leaf.unsafeGetTensorImpl()) == 0 && found_set.insert(leaf.unsafeGetTensorImpl()).second) {
      found.push_back(leaf);
    }
  };
  std::unordered_set<const torch::autograd::Node*> visited;
  std::vector<torch::autograd::Node*> stack;
  for (const auto& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    if (out.grad_fn()) {
      stack.push_back(out.grad_fn().get());
    } else {
      add_leaf(out);
    }
  }
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!visited.insert(node).second) continue;
    if (auto* accumulate = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      add_leaf(accumulate->variable);
      continue;
    }
    REMAT_CHECK(node->sequence_nr() >= first_sequence_nr, describe_input_use(name),
                "the function uses a tensor that requires grad and was computed outside it (it "
                "reaches autograd node ",
                node->name(), "). Pass that tensor in the checkpoint's inputs instead of capturing it.");
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
  return found;
}

variable_list detach_like(const variable_list& tensors, const std::vector<bool>& requires_grad) {
  variable_list out;
  out.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    out.push_back(tensors[i].defined() ? tensors[i].detach().requires_grad_(requires_grad[i]) : at::Tensor());
  }
  return out;
}

// What a checkpoint node saved, unpacked: the inputs (undefined ones put back), the parameters
// the function used and the RNG states of its forward.
struct SavedForBackward {
  variable_list inputs, parameters, rng_tensors;
  size_t count = 0;  // tensors saved besides the RNG states: the node's differentiable inputs
};

SavedForBackward unpack_saved(AutogradContext* ctx, const CheckpointState& state) {
  // Throws LibTorch's "backward through the graph a second time" error once the saved tensors
  // were released by a backward without retain_graph.
  variable_list saved = ctx->get_saved_variables();
  SavedForBackward out;
  out.rng_tensors.assign(saved.end() - static_cast<std::ptrdiff_t>(state.num_rng_tensors), saved.end());
  saved.resize(saved.size() - state.num_rng_tensors);
  out.count = saved.size();
  // The node's inputs are the defined inputs, then the parameters; put undefined ones back.
  out.inputs.resize(state.num_inputs);
  size_t next_saved = 0;
  for (size_t i = 0; i < state.num_inputs; ++i) {
    if (state.input_defined[i]) out.inputs[i] = saved[next_saved++];
  }
  out.parameters.assign(saved.begin() + static_cast<std::ptrdiff_t>(next_saved), saved.end());
  return out;
}

// The function run again as its forward ran: the same RNG states and autocast, grad mode on.
variable_list recompute(CheckpointState& state, const variable_list& inputs, const variable_list& rng_tensors,
                        bool create_graph) {
  c10::optional<detail::ForkedRngScope> rng;
  if (state.options.preserve_rng_state()) rng.emplace(state.rng.with_tensors(rng_tensors));
  detail::AutocastScope autocast(state.autocast);
  c10::AutoGradMode grad_enabled(true);
  StepPhaseScope phase(StepPhase::recompute);
  // Without create_graph the outputs only root the engine's run (released before it): the function
  // may skip computing values no backward reads, unless its calls are replayed.
  detail::RecomputingGraphOnlyScope graph_only(!create_graph && !state.log);
  detail::CheckpointForwardScope not_a_forward(false);
  c10::optional<detail::OperatorLog::Replaying> replaying;
  if (state.log) replaying.emplace(*state.log, inputs);
  variable_list outputs = state.fn(inputs);
  if (replaying) replaying->check_complete();
  return outputs;
}

// The recompute must return what the forward returned: the same count, shapes, dtypes, devices.
void check_recomputed_outputs(const CheckpointState& state, const variable_list& outputs) {
  const std::string& name = state.options.name();
  REMAT_CHECK(outputs.size() == state.output_meta.size(), describe_input_use(name), "the recompute returned ",
              outputs.size(), " tensors but the forward returned ", state.output_meta.size(),
              ". The function must be deterministic in what it returns.");
  for (size_t i = 0; i < outputs.size(); ++i) {
    const OutputMeta now = OutputMeta::of(outputs[i]);
    const OutputMeta& then = state.output_meta[i];
    REMAT_CHECK(
        now.defined == then.defined && now.sizes == then.sizes && now.dtype == then.dtype && now.device == then.device,
        describe_input_use(name), "output ", i, " of the recompute is ", describe(now), " but the forward's was ",
        describe(then), ". The function must compute the same shapes, dtypes and devices when re-run.");
  }
}

// The gradients of the node's inputs from the recomputed graph: one per saved tensor, plus one for
// forward()'s state argument. Differentiates with respect to every input and parameter that
// requires grad; the engine running this backward then delivers them once along the node's edges.
variable_list differentiate(variable_list outputs, const variable_list& grad_outputs,
                            const variable_list& recompute_inputs, const variable_list& parameters, size_t saved_count,
                            bool create_graph) {
  // grad_outputs has one entry per defined output: undefined outputs never enter the graph.
  variable_list roots, root_grads;
  for (size_t i = 0, g = 0; i < outputs.size(); ++i) {
    if (!outputs[i].defined()) continue;
    const at::Tensor& grad = grad_outputs[g++];
    if (outputs[i].requires_grad() && grad.defined()) {
      roots.push_back(outputs[i]);
      root_grads.push_back(grad);
    }
  }
  variable_list wrt;
  std::vector<size_t> wrt_position;  // index among the node's inputs
  size_t position = 0;
  for (const auto& input : recompute_inputs) {
    if (!input.defined()) continue;
    if (input.requires_grad()) {
      wrt.push_back(input);
      wrt_position.push_back(position);
    }
    ++position;
  }
  for (const auto& parameter : parameters) {
    if (parameter.requires_grad()) {
      wrt.push_back(parameter);
      wrt_position.push_back(position);
    }
    ++position;
  }
  variable_list grads(saved_count + 1);
  if (roots.empty() || wrt.empty()) return grads;
  outputs.clear();  // the roots are the only references left to the recomputed outputs
  variable_list computed = grad_releasing_roots(std::move(roots), wrt, root_grads, create_graph);
  for (size_t k = 0; k < computed.size(); ++k) grads[wrt_position[k]] = std::move(computed[k]);
  return grads;
}

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs_and_parameters,
                               const c10::intrusive_ptr<CheckpointState>& state) {
    ctx->set_materialize_grads(false);
    variable_list saved = inputs_and_parameters.vec();
    if (state->options.preserve_rng_state()) {
      const auto rng_tensors = state->rng.tensors();
      saved.insert(saved.end(), rng_tensors.begin(), rng_tensors.end());
      state->num_rng_tensors = rng_tensors.size();
      state->rng = state->rng.with_tensors(std::vector<at::Tensor>(rng_tensors.size()));  // keep only the devices
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return std::move(state->forward_outputs);
  }

  // Unpack, recompute, check, differentiate.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    // Before LibTorch's own check of the saved inputs: this message names the checkpoint.
    state->versions.check(state->options.name());
    SavedForBackward saved = unpack_saved(ctx, *state);
    // Under create_graph (double backward) the gradients' graph must reach the real inputs, so the
    // recompute runs on them; otherwise on detached copies, which keeps the recompute's graph apart.
    const bool create_graph = c10::GradMode::is_enabled();
    const variable_list recompute_inputs =
        create_graph ? saved.inputs : detach_like(saved.inputs, state->input_requires_grad);
    // Undone only after the recomputed graph's backward, which may read them (BatchNorm's saves the
    // running statistics).
    const std::vector<at::Tensor> restored =
        state->log ? state->log->restored_after_recompute(state->options.restore_after_recompute())
                   : state->options.restore_after_recompute();
    detail::RestoreTensorsScope restore(restored);
    variable_list outputs = recompute(*state, recompute_inputs, saved.rng_tensors, create_graph);
    check_recomputed_outputs(*state, outputs);
    return differentiate(std::move(outputs), grad_outputs, recompute_inputs, saved.parameters, saved.count,
                         create_graph);
  }
};

}  // namespace

namespace detail {

std::vector<at::Tensor> checkpoint_reentrant(const TensorListFunction& fn, const std::vector<at::Tensor>& inputs,
                                             const CheckpointOptions& options) {
  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = fn;
  state->options = options;
  state->num_inputs = inputs.size();
  for (const auto& t : inputs) {
    state->input_defined.push_back(t.defined());
    state->input_requires_grad.push_back(t.defined() && t.requires_grad());
    state->versions.record(t);
  }
  state->autocast = detail::AutocastSnapshot::capture();
  if (options.preserve_rng_state()) state->rng = detail::RngSnapshot::capture(inputs);
  if (detail::OperatorLog::wanted(options)) state->log = std::make_unique<detail::OperatorLog>(options, inputs);

  // Record the forward with its saved tensors dropped: memory as in a no-grad forward, but the
  // graph shows which parameters the function reaches.
  variable_list forward_inputs = detach_like(inputs, state->input_requires_grad);
  variable_list outputs;
  std::vector<at::Tensor> parameters;
  {
    detail::DropSavedTensorsScope drop_saved(&state->versions, options.name());
    const uint64_t first_sequence_nr = at::sequence_number::peek();
    {
      detail::CheckpointForwardScope forward(true);
      c10::optional<detail::OperatorLog::Recording> recording;
      if (state->log) recording.emplace(*state->log, forward_inputs);
      outputs = fn(forward_inputs);
    }
    check_outputs(outputs, options.name());
    parameters = find_used_parameters(outputs, forward_inputs, first_sequence_nr, options.name());
  }
  // A parameter changed in place before the recompute is refused naming the checkpoint, before
  // LibTorch's own check of the node's saved tensors.
  for (const auto& p : parameters) state->versions.record(p);
  for (const auto& t : outputs) state->output_meta.push_back(OutputMeta::of(t));
  for (const auto& t : outputs) {
    if (t.defined()) state->forward_outputs.push_back(t.detach());
  }
  variable_list inputs_and_parameters;
  for (const auto& t : inputs) {
    if (t.defined()) inputs_and_parameters.push_back(t);
  }
  inputs_and_parameters.insert(inputs_and_parameters.end(), parameters.begin(), parameters.end());
  // As a TensorList, not a vector: only then does Function::apply see the tensors as inputs.
  variable_list defined_results = CheckpointFunction::apply(at::TensorList(inputs_and_parameters), state);
  for (size_t i = 0, d = 0; i < outputs.size(); ++i) {
    outputs[i] = outputs[i].defined() ? std::move(defined_results[d++]) : at::Tensor();
  }
  return outputs;  // the recorded graph went with the old outputs
}

}  // namespace detail

}  // namespace remat
