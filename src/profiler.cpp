#include "remat/profiler.h"

#include <algorithm>
#include <chrono>

#include <ATen/Parallel.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/mul.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include "detail/cuda_memory.h"
#include "detail/forward_state.h"
#include "remat/checkpoint.h"
#include "remat/error.h"
#include "remat/memory.h"

namespace remat {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : (v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
}

double seconds_since(Clock::time_point start, c10::Device device) {
  detail::synchronize_if_cuda(device);
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t storage_bytes(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.storage().nbytes()) : 0;
}

at::Tensor stage_input(const at::Tensor& activation, bool first) {
  at::Tensor x = activation.detach();
  if (!first && at::isFloatingType(x.scalar_type())) x.requires_grad_(true);
  return x;
}

}  // namespace

CostTable profile_chain(Chain& chain, const at::Tensor& input, const ProfileOptions& options) {
  REMAT_CHECK(options.repeats() >= 1 && options.warmup() >= 0, "profile: repeats must be >= 1 and warmup >= 0.");
  const c10::Device device = input.device();
  if (device.is_cpu()) install_cpu_memory_tracker();
  const auto n = chain.size();

  // Every stage's real input: the chain run once without recording.
  std::vector<at::Tensor> activations;  // activations[i] is stage i's input
  {
    c10::NoGradGuard no_grad;
    at::Tensor a = input;
    for (int64_t i = 0; i < n; ++i) {
      activations.push_back(a);
      a = chain.forward_stage(i, a, chain.stages()[i].options.front());
    }
  }

  CostTable table;
  table.granularity = chain.granularity();
  {
    // What one checkpointed segment holds beyond its tensors (its RNG state).
    at::Tensor probe = at::ones({1}, input.options().dtype(at::kFloat)).requires_grad_(true);
    detail::synchronize_if_cuda(device);
    const int64_t before = memory_stats(device).current_bytes;
    at::Tensor y = checkpoint([](const at::Tensor& x) { return at::mul(x, x); }, probe);
    table.segment_bytes = std::max<int64_t>(0, memory_stats(device).current_bytes - before - storage_bytes(y));
  }
  table.source = "profiled on " + device.str() + ": median of " + std::to_string(options.repeats()) + " runs, " +
                 std::to_string(at::get_num_threads()) + " threads";
  for (int64_t i = 0; i < n; ++i) {
    const StageInfo& info = chain.stages()[i];
    StageCost cost;
    cost.name = info.name;
    for (const auto& p : chain.stage_parameters(i)) cost.parameter_bytes += storage_bytes(p);
    // Options and the segment-style forward are measured in interleaved rounds, so that machine
    // drift (two shared cores) moves them alike rather than favouring whichever ran last.
    std::vector<double> nograd_times;
    int64_t nograd_extra = 0;
    std::vector<std::vector<double>> forward_times(info.options.size()), backward_times(info.options.size());
    cost.options.resize(info.options.size());
    for (size_t o = 0; o < info.options.size(); ++o) cost.options[o].option = info.options[o];
    for (int r = -options.warmup(); r < options.repeats(); ++r) {
      for (size_t o = 0; o < info.options.size(); ++o) {
        StageOptionCost& oc = cost.options[o];
        at::Tensor x = stage_input(activations[i], i == 0);
        // Recording forward.
        detail::synchronize_if_cuda(device);
        const int64_t before = memory_stats(device).current_bytes;
        reset_peak_memory(device);
        auto start = Clock::now();
        at::Tensor y = chain.forward_stage(i, x, oc.option);
        const double forward_seconds = seconds_since(start, device);
        const auto after_forward = memory_stats(device);
        REMAT_CHECK(y.requires_grad(), "profile: stage '", info.name, "' produced an output that does not require grad.");
        // Backward, with the output's gradient allocated beforehand (it is δ(i), held).
        at::Tensor grad = at::ones_like(y);
        const int64_t before_backward = memory_stats(device).current_bytes;
        reset_peak_memory(device);
        start = Clock::now();
        torch::autograd::backward({y}, {grad});
        const double backward_seconds = seconds_since(start, device);
        const auto after_backward = memory_stats(device);
        const int64_t input_grad = x.requires_grad() ? storage_bytes(x) : 0;
        if (r < 0) continue;
        forward_times[o].push_back(forward_seconds);
        backward_times[o].push_back(backward_seconds);
        oc.kept_bytes = std::max(oc.kept_bytes, after_forward.current_bytes - before);
        oc.forward_extra_bytes = std::max(oc.forward_extra_bytes, after_forward.peak_bytes - after_forward.current_bytes);
        oc.backward_extra_bytes =
            std::max(oc.backward_extra_bytes, after_backward.peak_bytes - before_backward - input_grad);
        cost.output_bytes = storage_bytes(y);
        cost.input_grad_bytes = input_grad;
      }
      // Forward as a checkpointed segment runs it: recorded, saved tensors dropped.
      at::Tensor x = stage_input(activations[i], i == 0);
      detail::synchronize_if_cuda(device);
      const int64_t before = memory_stats(device).current_bytes;
      reset_peak_memory(device);
      const auto start = Clock::now();
      at::Tensor y;
      {
        detail::DropSavedTensorsScope drop_saved;
        y = chain.forward_stage(i, x, info.options.front());
      }
      const double seconds = seconds_since(start, device);
      const auto after = memory_stats(device);
      if (r < 0) continue;
      nograd_times.push_back(seconds);
      nograd_extra = std::max<int64_t>(nograd_extra, after.peak_bytes - before - storage_bytes(y));
    }
    for (size_t o = 0; o < info.options.size(); ++o) {
      cost.options[o].forward_seconds = median(forward_times[o]);
      cost.options[o].backward_seconds = median(backward_times[o]);
    }
    cost.nograd_seconds = median(nograd_times);
    cost.nograd_extra_bytes = std::max<int64_t>(nograd_extra, 0);
    for (auto& oc : cost.options) {
      oc.forward_extra_bytes = std::max<int64_t>(oc.forward_extra_bytes, 0);
      oc.backward_extra_bytes = std::max<int64_t>(oc.backward_extra_bytes, 0);
    }
    table.stages.push_back(std::move(cost));
  }
  return table;
}

}  // namespace remat
