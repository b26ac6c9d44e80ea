#include "remat/planning/planned.h"

#include <c10/core/GradMode.h>

#include "base/tensor_text.h"
#include "remat/base/error.h"

namespace remat {
namespace {

std::string shape_text(c10::IntArrayRef sizes, at::ScalarType dtype, c10::Device device) {
  return detail::tensor_text(sizes, dtype, &device);
}

}  // namespace

PlannedImpl::PlannedImpl(torch::nn::Sequential sequential, Budget budget, PlannedOptions options)
    : sequential_(std::move(sequential)), budget_(std::move(budget)), options_(std::move(options)) {
  REMAT_CHECK(!sequential_.is_empty() && sequential_->size() > 0, "Planned: the Sequential has no modules; give it ",
              "at least one.");
  chain_ = std::make_shared<SequentialChain>(sequential_, nullptr,
                                             SequentialChainOptions().group_sizes(options_.group_sizes()));
  // The Sequential's own children, registered under their own names: "0.weight", not "sequential.0.weight".
  for (const auto& child : sequential_->named_children()) register_module(child.key(), child.value());
}

const PlanResult& PlannedImpl::calibrate(const at::Tensor& sample_input) {
  REMAT_CHECK(sample_input.defined(), "Planned::calibrate: the sample input is undefined.");
  c10::AutoGradMode grad(true);
  result_ = plan_for_budget(*chain_, sample_input, budget_, options_.planning());
  calibrated_sizes_ = sample_input.sizes().vec();
  calibrated_dtype_ = sample_input.scalar_type();
  calibrated_device_ = sample_input.device();
  return *result_;
}

const PlanResult& PlannedImpl::budget_plan() const {
  REMAT_CHECK(result_.has_value(),
              "Planned: not calibrated yet; call calibrate(sample) or run a forward in training mode.");
  return *result_;
}

at::Tensor PlannedImpl::forward(const at::Tensor& input) {
  if (!is_training() || !c10::GradMode::is_enabled()) return chain_->forward(input);
  if (!result_) {
    calibrate(input);
  } else if (input.sizes() != c10::IntArrayRef(calibrated_sizes_) || input.scalar_type() != calibrated_dtype_ ||
             input.device() != calibrated_device_) {
    REMAT_CHECK(options_.replan_on_new_shape(), "Planned: the plan was made for inputs of ",
                shape_text(calibrated_sizes_, calibrated_dtype_, calibrated_device_), " but this input is ",
                shape_text(input.sizes(), input.scalar_type(), input.device()),
                "; activation sizes and so the plan depend on it. Call calibrate() with such a batch, or set ",
                "PlannedOptions::replan_on_new_shape.");
    calibrate(input);
  }
  return run_plan(*chain_, result_->plan, input);
}

void PlannedImpl::train(bool on) {
  torch::nn::Module::train(on);
  sequential_->train(on);
}

void PlannedImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::Planned(budget " << budget_.text() << ", "
         << (result_ ? "plan " + result_->plan.to_string() : std::string("not calibrated"))
         << (result_ && !result_->timed_under.empty() ? ", timed under " + result_->timed_under : std::string()) << ")";
}

}  // namespace remat
