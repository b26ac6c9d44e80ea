// The gradient synchroniser: averages gradients over the ranks in buckets, from hooks on the
// parameters' gradient accumulators.
#include "remat/distributed/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <sstream>

#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "base/torch_compat.h"
#include "remat/base/error.h"

namespace remat::distributed {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

struct GradientSynchronizer::Impl : std::enable_shared_from_this<GradientSynchronizer::Impl> {
  struct Bucket {
    std::vector<size_t> parameters;  // indices into `parameters`
    std::vector<int64_t> offsets;    // each one's first element in `flat`
    at::Tensor flat;                 // the gradients, then one "has a gradient" count per parameter
    int waiting = 0;                 // parameters with expected fires not yet complete this step
    bool ready = false, launched = false, reduce_again = false;
    ProcessGroup::Pending pending;
  };

  std::shared_ptr<ProcessGroup> group;
  std::vector<at::Tensor> parameters;
  SynchronizerOptions options;
  std::vector<detail::NodePointer<torch::autograd::Edge>> accumulators;  // kept alive: they hold the hooks
  std::vector<uintptr_t> hook_keys;
  std::vector<size_t> bucket_of;
  std::vector<Bucket> buckets;
  std::vector<int> fires, expected;  // this step's accumulator calls, and the first step's
  bool learned = false;
  size_t next_to_launch = 0;
  int no_sync_depth = 0;
  int launched_during_backward = 0;

  void reset_step() {
    std::fill(fires.begin(), fires.end(), 0);
    next_to_launch = 0;
    launched_during_backward = 0;
    for (auto& b : buckets) {
      b.waiting = 0;
      for (size_t p : b.parameters) b.waiting += expected[p] > 0 ? 1 : 0;
      b.ready = false;
      b.launched = b.reduce_again = false;
      b.pending = {};
    }
  }

  void launch(Bucket& b) {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < b.parameters.size(); ++i) {
      const at::Tensor& p = parameters[b.parameters[i]];
      at::Tensor slot = b.flat.narrow(0, b.offsets[i], p.numel());
      const at::Tensor& grad = p.grad();
      if (grad.defined()) {
        slot.copy_(grad.reshape({-1}));
      } else {
        slot.zero_();
      }
      b.flat[b.offsets.back() + static_cast<int64_t>(i)].fill_(grad.defined() ? 1.0 : 0.0);
    }
    b.pending = group->allreduce_sum_async(b.flat);
    b.launched = true;
  }

  // Buckets start in their order on every rank, so the ranks' collectives always match.
  void launch_ready_in_order() {
    while (next_to_launch < buckets.size() && buckets[next_to_launch].ready) {
      launch(buckets[next_to_launch++]);
      ++launched_during_backward;
    }
  }

  void on_ready(size_t index) {
    if (no_sync_depth > 0) return;
    const int count = ++fires[index];
    if (!learned || !options.overlap()) return;
    Bucket& b = buckets[bucket_of[index]];
    if (b.launched) {
      if (count > expected[index]) b.reduce_again = true;
      return;
    }
    if (count == expected[index] && --b.waiting == 0) {
      b.ready = true;
      launch_ready_in_order();
    }
  }

  // After the bucket's sum arrived: each parameter's gradient becomes the mean over ranks; one no
  // rank has a gradient for stays without one.
  void unpack(Bucket& b) {
    at::NoGradGuard no_grad;
    const int world = group->world_size();
    for (size_t i = 0; i < b.parameters.size(); ++i) {
      at::Tensor& p = parameters[b.parameters[i]];
      const double having = b.flat[b.offsets.back() + static_cast<int64_t>(i)].item<double>();
      if (having == 0) continue;
      at::Tensor mean = b.flat.narrow(0, b.offsets[i], p.numel()).view(p.sizes()).div(world);
      if (p.grad().defined()) {
        p.mutable_grad().copy_(mean);
      } else {
        p.mutable_grad() = mean.clone();
      }
    }
  }
};

namespace {

// Calls `on_ready` after a parameter's gradient accumulator has run (the synchronizer holds it weakly).
struct ReadyHook : torch::autograd::FunctionPostHook {
  explicit ReadyHook(std::function<void()> on_ready) : on_ready_(std::move(on_ready)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    on_ready_();
    return outputs;
  }
  std::function<void()> on_ready_;
};

}  // namespace

GradientSynchronizer::GradientSynchronizer(std::shared_ptr<ProcessGroup> group, std::vector<at::Tensor> parameters,
                                           SynchronizerOptions options)
    : impl_(std::make_shared<Impl>()) {
  REMAT_CHECK(group != nullptr, "GradientSynchronizer: no process group; join one with ProcessGroup::join().");
  REMAT_CHECK(options.bucket_bytes() >= 1, "GradientSynchronizer: bucket_bytes must be positive, got ",
              options.bucket_bytes(), ".");
  auto& s = *impl_;
  s.group = std::move(group);
  s.options = options;
  std::vector<std::string> shapes;
  for (const auto& p : parameters) {
    if (!p.requires_grad()) continue;
    REMAT_CHECK(p.is_leaf(), "GradientSynchronizer: parameter ", s.parameters.size(),
                " is not a leaf tensor; pass a module's parameters().");
    s.parameters.push_back(p);
    std::ostringstream shape;
    shape << "parameter " << s.parameters.size() - 1 << ": " << p.sizes() << " " << p.scalar_type();
    shapes.push_back(shape.str());
  }
  REMAT_CHECK(!s.parameters.empty(), "GradientSynchronizer: no parameter requires a gradient.");
  s.group->check_same("the parameters' shapes", shapes);

  // Buckets in reverse order of the parameters (backward produces the last layers' gradients
  // first), each up to bucket_bytes of one dtype and device.
  const size_t n = s.parameters.size();
  s.bucket_of.assign(n, 0);
  std::vector<std::vector<size_t>> groups;
  int64_t bytes = 0;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = n - 1 - k;
    const at::Tensor& p = s.parameters[i];
    const int64_t size = p.numel() * static_cast<int64_t>(p.element_size());
    const bool fits = !groups.empty() && bytes + size <= options.bucket_bytes() &&
                      s.parameters[groups.back().front()].scalar_type() == p.scalar_type() &&
                      s.parameters[groups.back().front()].device() == p.device();
    if (!fits) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(i);
    bytes += size;
  }
  for (const auto& members : groups) {
    Impl::Bucket b;
    b.parameters = members;
    int64_t offset = 0;
    for (size_t i : members) {
      b.offsets.push_back(offset);
      offset += s.parameters[i].numel();
      s.bucket_of[i] = s.buckets.size();
    }
    b.offsets.push_back(offset);  // where the per-parameter "has a gradient" counts start
    const at::Tensor& first = s.parameters[members.front()];
    b.flat = at::zeros({offset + static_cast<int64_t>(members.size())}, first.options().requires_grad(false));
    s.buckets.push_back(std::move(b));
  }
  s.fires.assign(n, 0);
  s.expected.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(s.parameters[i]);
    REMAT_CHECK(accumulator != nullptr, "GradientSynchronizer: parameter ", i, " has no gradient accumulator.");
    s.hook_keys.push_back(
        accumulator->add_post_hook(std::make_unique<ReadyHook>([owner = std::weak_ptr<Impl>(impl_), i] {
          if (auto live = owner.lock()) live->on_ready(i);
        })));
    s.accumulators.push_back(std::move(accumulator));
  }
  s.reset_step();
}

GradientSynchronizer::~GradientSynchronizer() {
  for (size_t i = 0; i < impl_->accumulators.size(); ++i) impl_->accumulators[i]->del_post_hook(impl_->hook_keys[i]);
}

void GradientSynchronizer::broadcast_parameters(std::vector<at::Tensor> buffers) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> tensors;
  for (const auto& p : impl_->parameters) tensors.push_back(p.detach());
  for (const auto& b : buffers) tensors.push_back(b);
  for (const auto& t : tensors) impl_->group->broadcast({t}, 0);
}

SyncStats GradientSynchronizer::finish() {
  auto& s = *impl_;
  REMAT_CHECK(s.no_sync_depth == 0, "GradientSynchronizer: finish() inside no_sync(); let the guard go first.");
  SyncStats stats;
  stats.buckets = static_cast<int>(s.buckets.size());
  stats.buckets_during_backward = s.launched_during_backward;
  while (s.next_to_launch < s.buckets.size()) s.launch(s.buckets[s.next_to_launch++]);
  const auto start = Clock::now();
  for (auto& b : s.buckets) b.pending.wait();
  // A gradient that fired again after its bucket left: reduce that bucket once more, whole.
  for (auto& b : s.buckets) {
    if (!b.reduce_again) continue;
    ++stats.buckets_reduced_again;
    s.launch(b);
    b.pending.wait();
  }
  stats.wait_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (auto& b : s.buckets) s.unpack(b);
  if (!s.learned) {
    s.expected = s.fires;
    s.learned = true;
  }
  s.reset_step();
  return stats;
}

GradientSynchronizer::NoSync::NoSync(GradientSynchronizer& owner) : owner_(owner) { ++owner_.impl_->no_sync_depth; }
GradientSynchronizer::NoSync::~NoSync() { --owner_.impl_->no_sync_depth; }

int64_t GradientSynchronizer::bucket_bytes_allocated() const {
  int64_t bytes = 0;
  for (const auto& b : impl_->buckets) bytes += b.flat.numel() * static_cast<int64_t>(b.flat.element_size());
  return bytes;
}

int GradientSynchronizer::buckets() const { return static_cast<int>(impl_->buckets.size()); }

}  // namespace remat::distributed
