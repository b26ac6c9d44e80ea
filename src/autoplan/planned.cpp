#include "remat/autoplan/planned.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/GradMode.h>

#include "base/tensor_text.h"
#include "remat/base/error.h"
#include "remat/measure/profiler.h"

namespace remat {
namespace {

// The profiled shapes a fit is made over: the latest, where shapes keep falling outside it.
constexpr size_t kMaxFittedShapes = 64;

std::string shape_text(c10::IntArrayRef sizes, at::ScalarType dtype, c10::Device device) {
  return detail::tensor_text(sizes, dtype, &device);
}

}  // namespace

PlannedImpl::PlannedImpl(torch::nn::Sequential sequential, Budget budget, PlannedOptions options)
    : sequential_(std::move(sequential)), budget_(std::move(budget)), options_(std::move(options)) {
  REMAT_CHECK(!sequential_.is_empty() && sequential_->size() > 0, "Planned: the Sequential has no modules; give it ",
              "at least one.");
  REMAT_CHECK(options_.max_cached_plans() >= 1, "Planned: max_cached_plans must be at least 1 (the plan in use), got ",
              options_.max_cached_plans(), ".");
  REMAT_CHECK(options_.replan_on_new_shape() || (!options_.fit_shapes() && !options_.shape_costs()),
              "Planned: fit_shapes and shape_costs plan new shapes: set replan_on_new_shape as well.");
  REMAT_CHECK(!options_.fit_shapes() || !options_.fit_shapes()->exponents.empty(),
              "Planned: fit_shapes has no terms; give ShapeTerms::batch_only(), batch_and_length() or your own.");
  REMAT_CHECK(!options_.fit_shapes() || !options_.shape_costs() ||
                  options_.fit_shapes()->dimensions == options_.shape_costs()->terms().dimensions,
              "Planned: fit_shapes and the shape_costs given are in different dimensions (",
              options_.fit_shapes()->describe(), " against ",
              options_.shape_costs() ? options_.shape_costs()->terms().describe() : std::string(), ").");
  fit_ = options_.shape_costs();
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
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int64_t> shape = fit_shape_of(sample_input);
  bool from_fit = fit_ && fit_->covers(shape);
  PlanResult result;
  if (from_fit) {
    // Solved on the fitted costs and verified by one measured step of this shape: the fit's times
    // are least squares, too rough to time plans against each other, so no measured choice.
    PlanningOptions planning = options_.planning();
    planning.choice().when(ChooseByMeasurement::never);
    try {
      result = make_plan(PlanRequest::of_budget(budget_).options(planning),
                         PlanSubject(*chain_, sample_input).costs(fit_->at(shape)));
    } catch (const c10::Error&) {
      // No plan on the fitted costs measured within the budget (a transient buffer the fit misses):
      // the shape is profiled like one outside the fit; a budget no plan meets fails there, saying so.
      from_fit = false;
    }
  }
  if (!from_fit) {
    const PlanningOptions& planning = options_.planning();
    CostTable profiled = profile_chain(*chain_, sample_input, planning.profile(), planning.mode());
    ++shapes_profiled_;
    result = make_plan(PlanRequest::of_budget(budget_).options(planning),
                       PlanSubject(*chain_, sample_input).costs(profiled));
    if (options_.fit_shapes()) {
      // Fitted once there are as many shapes as terms (one shape profiled again replaces its table).
      auto same =
          std::find_if(profiled_.begin(), profiled_.end(), [&](const ShapedCosts& c) { return c.shape == shape; });
      if (same != profiled_.end()) profiled_.erase(same);
      profiled_.push_back(ShapedCosts{shape, std::move(profiled)});
      if (profiled_.size() > kMaxFittedShapes) profiled_.erase(profiled_.begin());
      if (profiled_.size() >= options_.fit_shapes()->exponents.size()) {
        try {
          fit_ = ShapeCosts::fit(profiled_, *options_.fit_shapes());
        } catch (const c10::Error&) {
          // The shapes so far do not tell the terms apart (every batch the same, say): the tables
          // are one chain's, so that is the one failure here, and profiling on is the way out.
        }
      }
    }
  }
  ShapePlan made{sample_input.sizes().vec(),
                 sample_input.scalar_type(),
                 sample_input.device(),
                 std::move(result),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                 from_fit};
  ++plans_made_;
  if (ShapePlan* old = find_plan(sample_input)) {
    *old = std::move(made);  // find_plan moved it last
  } else {
    if (static_cast<int64_t>(plans_.size()) >= options_.max_cached_plans()) plans_.erase(plans_.begin());
    plans_.push_back(std::move(made));
  }
  return plans_.back().result;
}

PlannedImpl::ShapePlan* PlannedImpl::find_plan(const at::Tensor& input) {
  for (auto it = plans_.begin(); it != plans_.end(); ++it) {
    if (input.sizes() == c10::IntArrayRef(it->sizes) && input.scalar_type() == it->dtype &&
        input.device() == it->device) {
      std::rotate(it, it + 1, plans_.end());  // the most recently used last
      return &plans_.back();
    }
  }
  return nullptr;
}

const PlanResult& PlannedImpl::budget_plan() const {
  REMAT_CHECK(!plans_.empty(),
              "Planned: not calibrated yet; call calibrate(sample) or run a forward in training mode.");
  return plans_.back().result;
}

bool PlannedImpl::planned_from_fit() const {
  budget_plan();  // the same error before calibration
  return plans_.back().from_fit;
}

std::vector<int64_t> PlannedImpl::fit_shape_of(const at::Tensor& input) const {
  const ShapeTerms* terms = options_.fit_shapes() ? &*options_.fit_shapes() : fit_ ? &fit_->terms() : nullptr;
  if (terms == nullptr) return {};
  const size_t dimensions = terms->dimensions.size();
  std::vector<int64_t> shape;
  if (options_.shape_of()) {
    shape = options_.shape_of()(input);
  } else {
    REMAT_CHECK(static_cast<size_t>(input.dim()) >= dimensions, "Planned: an input of ",
                shape_text(input.sizes(), input.scalar_type(), input.device()), " has fewer dimensions than the fit's ",
                dimensions, " (", terms->describe(), "); give PlannedOptions::shape_of to say which sizes they are.");
    for (size_t d = 0; d < dimensions; ++d) shape.push_back(input.size(static_cast<int64_t>(d)));
  }
  bool positive = shape.size() == dimensions;
  for (const int64_t size : shape) positive = positive && size >= 1;
  REMAT_CHECK(positive, "Planned: shape_of gave ", c10::IntArrayRef(shape), " for an input of ",
              shape_text(input.sizes(), input.scalar_type(), input.device()), "; the fit needs ", dimensions,
              " positive sizes (", terms->describe(), ").");
  return shape;
}

double PlannedImpl::planning_seconds() const {
  budget_plan();  // the same error before calibration
  return plans_.back().planning_seconds;
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
  if (plans_.empty()) {
    calibrate_outside(input);
  } else if (find_plan(input) == nullptr) {
    const ShapePlan& last = plans_.back();
    REMAT_CHECK(options_.replan_on_new_shape(), "Planned: the plan was made for inputs of ",
                shape_text(last.sizes, last.dtype, last.device), " but this input is ",
                shape_text(input.sizes(), input.scalar_type(), input.device()),
                "; activation sizes and so the plan depend on it. Call calibrate() with such a batch, or set ",
                "PlannedOptions::replan_on_new_shape.");
    calibrate_outside(input);
  }
  return run_plan(chain_, plans_.back().result.plan, input);  // held until backward: this module may be gone by then
}

void PlannedImpl::train(bool on) {
  torch::nn::Module::train(on);
  sequential_->train(on);
}

void PlannedImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::Planned(budget " << budget_.text() << ", "
         << (calibrated() ? "plan " + budget_plan().plan.to_string() : std::string("not calibrated"))
         << (calibrated() && !budget_plan().timed_under.empty() ? ", timed under " + budget_plan().timed_under
                                                                : std::string())
         << (plans_.size() > 1 ? ", " + std::to_string(plans_.size()) + " shapes planned" : std::string())
         << (fit_ ? ", costs fitted over " + std::to_string(fit_->fitted_shapes().size()) + " shapes" : std::string())
         << ")";
}

}  // namespace remat
