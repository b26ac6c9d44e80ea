#include <memory>
#include <sstream>
#include <utility>

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/saved_variable.h>

#include "checkpoint/checkpoint_modes.h"
#include "base/tensor_text.h"
#include "checkpoint/forward_state.h"
#include "checkpoint/operator_log.h"
#include "checkpoint/recompute_state.h"
#include "checkpoint/saved_versions.h"
#include "remat/checkpoint/checkpoint.h"
#include "remat/base/error.h"
#include "remat/memory/memory_timeline.h"

namespace remat {

// ---------------------------------------------------------------------------------------------
// Non-reentrant mode. The forward's saved tensors become handles into a Frame; the first unpack
// recomputes the function under hooks that fill the handles, and stops it once all live handles
// are filled.

namespace {

using detail::describe_input_use;
using torch::autograd::variable_list;

struct SavedMeta {
  std::vector<int64_t> sizes;
  at::ScalarType dtype = at::kFloat;
  c10::Device device = c10::kCPU;

  static SavedMeta of(const at::Tensor& t) { return {t.sizes().vec(), t.scalar_type(), t.device()}; }
  bool operator==(const SavedMeta& o) const { return sizes == o.sizes && dtype == o.dtype && device == o.device; }
  std::string describe() const { return detail::tensor_text(sizes, dtype, &device); }
};

// Thrown by the recompute's pack hook once every live handle is filled; caught by the recompute.
struct StopRecompute {};

// Which backward runs on this thread (none: nullptr). A backward inside the function (a gradient
// penalty's torch::autograd::grad) is another than the one that runs the checkpoint's.
const void* current_backward() { return torch::autograd::get_current_graph_task_exec_info(); }

struct Frame : std::enable_shared_from_this<Frame> {
  TensorListFunction fn;
  CheckpointOptions options;
  // The inputs, saved as autograd saves tensors: through the enclosing hooks, so a checkpoint
  // nested in another keeps its inputs as the outer one's handles.
  std::vector<torch::autograd::SavedVariable> inputs;
  std::vector<bool> input_requires_grad;
  detail::RngSnapshot rng;
  detail::AutocastSnapshot autocast;

  detail::SavedVersions versions;      // of the inputs and of what the forward saved
  std::vector<SavedMeta> packed;       // what the forward saved, per handle
  std::vector<bool> alive;             // the handle's saved variable still exists
  std::vector<bool> inner;             // saved by a backward run inside the function (create_graph)
  std::vector<at::Tensor> recomputed;  // filled by a recompute, taken by the handle's unpack
  size_t recompute_next = 0, recompute_last = 0;
  const void* forward_backward = nullptr;    // the backward the forward ran in (nested checkpoints), if any
  const void* recompute_backward = nullptr;  // the backward whose unpack started the recompute
  bool forward_running = false;              // an unpack now comes from autograd::grad inside the function
  std::unique_ptr<detail::OperatorLog> log;  // the forward's operator calls (a policy, check_reads)

  void recompute(size_t requested);
};

// A forward's saved tensor: only its place in the frame.
struct Handle final : detail::SavedTensorHooks {
  explicit Handle(std::shared_ptr<Frame> frame)
      : SavedTensorHooks("a non-reentrant checkpoint"), frame_(std::move(frame)), index_(frame_->packed.size()) {
    frame_->packed.emplace_back();
    frame_->alive.push_back(true);
    frame_->inner.push_back(current_backward() != frame_->forward_backward);
    frame_->recomputed.emplace_back();
  }
  ~Handle() override {
    frame_->alive[index_] = false;
    frame_->recomputed[index_] = at::Tensor();
  }
  void call_pack_hook(const at::Tensor& tensor) override {
    frame_->packed[index_] = SavedMeta::of(tensor);
    frame_->versions.record(tensor);
  }
  at::Tensor call_unpack_hook() override {
    if (!frame_->recomputed[index_].defined()) frame_->recompute(index_);
    return std::exchange(frame_->recomputed[index_], at::Tensor());
  }

 private:
  std::shared_ptr<Frame> frame_;
  size_t index_;
};

// A recompute's saved tensor: checked against the forward's and handed to the handle; kept too, for
// a backward inside the recompute itself (autograd::grad in the function).
struct RecomputeSaver final : detail::SavedTensorHooks {
  explicit RecomputeSaver(Frame* frame) : SavedTensorHooks("a non-reentrant checkpoint"), frame_(frame) {}
  void call_pack_hook(const at::Tensor& tensor) override {
    detail::HiddenFromEnclosingLog hidden;  // the forward's hook made no operator calls either
    saved_ = tensor.detach();
    const size_t i = frame_->recompute_next++;
    const std::string& name = frame_->options.name();
    REMAT_CHECK(i < frame_->packed.size(), describe_input_use(name), "the recompute saved more tensors for backward (",
                i + 1, ") than the forward did (", frame_->packed.size(),
                "). The function must run the same operations when re-run.");
    const SavedMeta now = SavedMeta::of(tensor);
    REMAT_CHECK(now == frame_->packed[i], describe_input_use(name), "saved tensor ", i, " of the recompute is ",
                now.describe(), " but the forward's was ", frame_->packed[i].describe(),
                ". The function must compute the same shapes, dtypes and devices when re-run.");
    if (frame_->alive[i]) frame_->recomputed[i] = saved_;
    // Not from inside a backward the function runs: the engine would not pass the stop through.
    if (i >= frame_->recompute_last && current_backward() == frame_->recompute_backward) throw StopRecompute{};
  }
  at::Tensor call_unpack_hook() override { return saved_; }

 private:
  Frame* frame_;
  at::Tensor saved_;
};

void Frame::recompute(size_t requested) {
  // While the forward runs, an unpack comes from a backward inside the function: the recompute
  // stops before that backward's own saved tensors, which only a recompute of the whole function
  // (reaching that backward again) makes.
  if (forward_running) {
    REMAT_CHECK(!inner[requested], describe_input_use(options.name()),
                "a backward inside the function reads a tensor saved by another backward inside it (a gradient "
                "of a gradient taken within the checkpointed function): not supported. Take the second gradient "
                "outside the checkpoint.");
  }
  bool any = false;
  for (size_t i = 0; i < alive.size(); ++i) {
    if (alive[i] && !(forward_running && inner[i])) recompute_last = i, any = true;
  }
  if (!any) return;
  auto keep_alive = shared_from_this();  // the unpacking handle may be the last owner
  // From a backward inside the function's forward, whose calls are being recorded: the recompute's
  // own work is not the function's.
  detail::HiddenFromEnclosingLog hidden;
  versions.check(options.name());
  variable_list args;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor input = inputs[i].unpack();
    args.push_back(input.defined() ? input.detach().requires_grad_(input_requires_grad[i]) : at::Tensor());
  }
  recompute_next = 0;
  const void* previous_backward = std::exchange(recompute_backward, current_backward());
  {
    const std::vector<at::Tensor> restored =
        log ? log->restored_after_recompute(options.restore_after_recompute()) : options.restore_after_recompute();
    detail::RestoreTensorsScope restore(restored);
    c10::optional<detail::ForkedRngScope> forked;
    if (options.preserve_rng_state()) forked.emplace(rng);
    detail::AutocastScope autocast_state(autocast);
    c10::AutoGradMode grad_enabled(true);
    StepPhaseScope phase(StepPhase::recompute);
    detail::RecomputingGraphOnlyScope values_needed(false);  // the early stop replaces graph-only stages
    detail::SavedTensorHooksScope hooks([this] { return std::make_unique<RecomputeSaver>(this); });
    detail::CheckpointForwardScope not_a_forward(false);
    c10::optional<detail::OperatorLog::Replaying> replaying;
    // A recompute while the forward runs keeps the kept results for the backward's.
    if (log) replaying.emplace(*log, args, /*release=*/!forward_running);
    try {
      fn(args);
    } catch (const StopRecompute&) {
    }
  }
  recompute_backward = previous_backward;
  REMAT_CHECK(recompute_next > recompute_last, describe_input_use(options.name()), "the recompute saved ",
              recompute_next, " tensors for backward but the forward saved ", packed.size(),
              ". The function must run the same operations when re-run.");
}

}  // namespace

namespace detail {

std::vector<at::Tensor> checkpoint_non_reentrant(const TensorListFunction& fn, const std::vector<at::Tensor>& inputs,
                                                 const CheckpointOptions& options) {
  auto frame = std::make_shared<Frame>();
  frame->fn = fn;
  frame->options = options;
  for (const auto& t : inputs) {
    // Detached: the recompute detaches them anyway, and a saved leaf that requires grad keeps only
    // a weak reference to its gradient accumulator, gone by the time a checkpoint nested in another
    // unpacks it (LibTorch's "No grad accumulator for a saved leaf"). The version counter is shared,
    // so an in-place change is still refused.
    frame->inputs.emplace_back(t.defined() ? t.detach() : t, /*is_output=*/false);
    frame->input_requires_grad.push_back(t.defined() && t.requires_grad());
    frame->versions.record(t);
  }
  frame->autocast = detail::AutocastSnapshot::capture();
  if (options.preserve_rng_state()) frame->rng = detail::RngSnapshot::capture(inputs);
  if (detail::OperatorLog::wanted(options)) frame->log = std::make_unique<detail::OperatorLog>(options, inputs);
  frame->forward_backward = current_backward();
  variable_list outputs;
  {
    // Handles own the frame: it lives while the graph holds any of its saved tensors.
    detail::SavedTensorHooksScope hooks([&frame] { return std::make_unique<Handle>(frame); });
    detail::CheckpointForwardScope forward(true);
    c10::optional<detail::OperatorLog::Recording> recording;
    if (frame->log) recording.emplace(*frame->log, inputs);
    frame->forward_running = true;
    struct ForwardDone {
      Frame& frame;
      ~ForwardDone() { frame.forward_running = false; }
    } done{*frame};
    outputs = fn(inputs);
  }
  check_outputs(outputs, options.name());
  return outputs;
}

}  // namespace detail

}  // namespace remat
