#include "remat/autoplan/planned.h"

#include <exception>
#include <thread>

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
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
  for (size_t i = 0; i < sequential_->size(); ++i) modules_.push_back(sequential_->ptr(i).get());
}

void PlannedImpl::check_modules(const char* who) const {
  // The chain and the plan cover the modules the Sequential had when this was made: one appended
  // since would be skipped silently, one replaced would run outside the plan's costs.
  const size_t now = sequential_->size();
  bool same = now == modules_.size();
  size_t first_difference = std::min(now, modules_.size());
  for (size_t i = 0; same && i < now; ++i) {
    if (sequential_->ptr(i).get() != modules_[i]) {
      same = false;
      first_difference = i;
    }
  }
  REMAT_CHECK(same, who, ": the Sequential has changed since this Planned was made: it had ", modules_.size(),
              " modules and now has ", now, ", first differing at module ", first_difference,
              " (a module appended, removed or replaced afterwards). The plan covers the modules it had, and would ",
              "skip or mis-cost the others. Finish the Sequential first, then make a Planned of it (a new one for ",
              "the changed Sequential).");
}

const PlanResult& PlannedImpl::calibrate(const at::Tensor& sample_input) {
  check_modules("Planned::calibrate");
  REMAT_CHECK(sample_input.defined(), "Planned::calibrate: the sample input is undefined.");
  REMAT_CHECK(sample_input.numel() > 0, "Planned::calibrate: the sample batch of shape ",
              shape_text(sample_input.sizes(), sample_input.scalar_type(), sample_input.device()),
              " has no elements (0 rows?): activation sizes and times cannot be measured on it. Calibrate on a batch ",
              "of the size you train with.");
  c10::AutoGradMode grad(true);
  result_ = make_plan(PlanRequest::of_budget(budget_).options(options_.planning()), PlanSubject(*chain_, sample_input));
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

void PlannedImpl::calibrate_outside(const at::Tensor& sample_input) {
  // A forward may run inside a checkpoint: in its recompute (inside a backward) or in a
  // non-reentrant checkpoint's forward, whose saved-tensor hooks would capture every tensor the
  // profiler saves. Both are this thread's state; a thread of its own has neither, and gets this
  // thread's LibTorch state (grad mode, autocast) and intra-op threads. The caller waits: nothing
  // else allocates meanwhile, so the memory it measures is its own. The sample is a leaf of its
  // own (as a requires-grad input, the sample's gradient goes nowhere), made there: this thread
  // makes no operator call, so a checkpoint's forward and its recompute make the same ones here.
  const at::ThreadLocalState state;
  const int intra_op = at::get_num_threads();
  std::exception_ptr failure;
  std::thread calibration([&] {
    try {
      at::ThreadLocalStateGuard same_state(state);
      if (at::get_num_threads() != intra_op) at::set_num_threads(intra_op);
      calibrate(sample_input.detach().requires_grad_(sample_input.requires_grad()));
    } catch (...) {
      failure = std::current_exception();
    }
  });
  calibration.join();
  if (failure) std::rethrow_exception(failure);
}

at::Tensor PlannedImpl::forward(const at::Tensor& input) {
  check_modules("Planned::forward");
  if (!is_training() || !c10::GradMode::is_enabled()) return chain_->forward(input);
  if (!result_) {
    calibrate_outside(input);
  } else if (input.sizes() != c10::IntArrayRef(calibrated_sizes_) || input.scalar_type() != calibrated_dtype_ ||
             input.device() != calibrated_device_) {
    REMAT_CHECK(options_.replan_on_new_shape(), "Planned: the plan was made for inputs of ",
                shape_text(calibrated_sizes_, calibrated_dtype_, calibrated_device_), " but this input is ",
                shape_text(input.sizes(), input.scalar_type(), input.device()),
                "; activation sizes and so the plan depend on it. Call calibrate() with such a batch, or set ",
                "PlannedOptions::replan_on_new_shape.");
    calibrate_outside(input);
  }
  return run_plan(chain_, result_->plan, input);  // held until backward: this module may be gone by then
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
