#include "remat/checkpoint/checkpointed.h"

#include <algorithm>

#include "remat/base/error.h"

namespace remat {

std::vector<std::pair<int64_t, int64_t>> checkpoint_sequential_segments(int64_t items, int64_t segments) {
  REMAT_CHECK(segments >= 1 && segments <= std::max<int64_t>(items, 1), "segments must be between 1 and the number of ",
              "items (", items, "), got ", segments, ".");
  std::vector<std::pair<int64_t, int64_t>> ranges;
  const int64_t size = items / segments;
  for (int64_t s = 0; s + 1 < segments && size > 0; ++s) ranges.emplace_back(s * size, (s + 1) * size);
  return ranges;
}

CheckpointedImpl::CheckpointedImpl(torch::nn::AnyModule module, CheckpointOptions options)
    : CheckpointedImpl(
          module.is_empty() ? nullptr : module.ptr(),
          [module](const at::Tensor& x) mutable { return module.forward(x); }, std::move(options)) {}

CheckpointedImpl::CheckpointedImpl(torch::nn::Sequential sequential, CheckpointOptions options)
    : CheckpointedImpl(
          sequential.ptr(), [sequential = sequential.ptr()](const at::Tensor& x) { return sequential->forward(x); },
          std::move(options)) {}

CheckpointedImpl::CheckpointedImpl(std::shared_ptr<torch::nn::Module> module, TensorFunction forward,
                                   CheckpointOptions options)
    : module_(std::move(module)), forward_(std::move(forward)), options_(std::move(options)) {
  REMAT_CHECK(module_ != nullptr, "Checkpointed: the module to wrap is empty.");
  // Registering the wrapped module's own members (not the module itself) keeps every name as it
  // was: "fc1.weight", not "module.fc1.weight".
  for (const auto& child : module_->named_children()) register_module(child.key(), child.value());
  for (const auto& p : module_->named_parameters(/*recurse=*/false)) {
    register_parameter(p.key(), p.value(), p.value().requires_grad());
  }
  for (const auto& b : module_->named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
  if (options_.name() == CheckpointOptions().name()) options_.name(module_->name());
}

at::Tensor CheckpointedImpl::forward(const at::Tensor& input) {
  if (!enabled_) return forward_(input);
  CheckpointOptions options = options_;
  if (is_training()) options.restore_after_recompute(buffers());
  return checkpoint(forward_, input, options);
}

void CheckpointedImpl::train(bool on) {
  torch::nn::Module::train(on);
  module_->train(on);
}

void CheckpointedImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::Checkpointed(" << (enabled_ ? "enabled" : "disabled") << ", ";
  module_->pretty_print(stream);
  stream << ")";
}

at::Tensor checkpoint_sequential(const torch::nn::Sequential& sequential, int64_t segments, const at::Tensor& input,
                                 const CheckpointOptions& options) {
  const auto n = static_cast<int64_t>(sequential->size());
  REMAT_CHECK(segments >= 1 && segments <= n, "checkpoint_sequential: segments must be between 1 and ",
              "the number of modules (", n, "), got ", segments, ".");
  const std::vector<torch::nn::AnyModule> modules(sequential->begin(), sequential->end());
  auto run = [&modules](int64_t begin, int64_t end) {
    std::vector<torch::nn::AnyModule> part(modules.begin() + begin, modules.begin() + end);
    return [part](const at::Tensor& x) mutable {
      at::Tensor y = x;
      for (auto& module : part) y = module.forward(y);
      return y;
    };
  };
  at::Tensor x = input;
  int64_t begin = 0, index = 0;
  for (const auto& [first, end] : checkpoint_sequential_segments(n, segments)) {
    CheckpointOptions segment_options = options;
    segment_options.name(options.name() + " segment " + std::to_string(index++));
    if (sequential->is_training()) {
      std::vector<at::Tensor> buffers;
      for (int64_t i = first; i < end; ++i) {
        for (const auto& b : modules[i].ptr()->buffers()) buffers.push_back(b);
      }
      segment_options.restore_after_recompute(std::move(buffers));
    }
    x = checkpoint(run(first, end), x, segment_options);
    begin = end;
  }
  return run(begin, n)(x);
}

}  // namespace remat
