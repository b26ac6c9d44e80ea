// remat/autoplan/planned.h — a Sequential that plans its own checkpointing under a memory budget.
//
//   remat::Planned net(torch::nn::Sequential(...), "50%");   // or remat::Budget::bytes(512 << 20)
//   auto y = net->forward(x);        // first forward in training mode: profile, plan, then run
//   std::cout << net->plan().to_string();                      // what it keeps, what it recomputes
//
// Calibration profiles the modules on a sample batch (explicitly with calibrate(), or on the first
// forward in training mode) and plans through make_plan (make_plan.h: the optimal plan, verified,
// timed against the nearest rules of thumb); every training forward then runs under that plan. A plan
// is valid for one input shape, dtype and device: a forward on another is an error naming both
// shapes, unless PlannedOptions::replan_on_new_shape is set, in which case it plans for the new shape
// and keeps the plans of the shapes seen (up to max_cached_plans, the least recently used dropped),
// so a shape seen before runs at once under its own plan. With costs that follow the shape
// (PlannedOptions::fit_shapes, or a fit given as shape_costs; planning/shape_costs.h), a new shape
// the fit covers is not profiled: its plan is solved on the fitted costs (milliseconds) and verified
// by one measured step of that shape, planned again lower while it passes the budget; a shape outside
// the fitted range is profiled (and, with fit_shapes, fitted in). In evaluation mode or without grad
// it runs plainly.
// Parameter and buffer names are the Sequential's own ("0.weight"), so state files load either way.
// The modules are those the Sequential had when the Planned was made: a module appended, removed or
// replaced afterwards is refused at the next forward or calibration (build a new Planned). A sample
// batch without elements (0 rows) is refused: nothing can be measured on it. The first training
// forward may run inside a checkpoint's forward or recompute (remat::checkpoint(... planned->forward
// ...)): it calibrates on a thread of its own, outside the checkpoint, then runs under the plan.
#pragma once

#include <functional>
#include <optional>
#include <ostream>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include "remat/autoplan/make_plan.h"
#include "remat/chain/sequential_chain.h"
#include "remat/planning/shape_costs.h"

namespace remat {

struct PlannedOptions {
  /// How the plan is made: the checkpoint mode, profiling repeats, the memory grid, verification.
  TORCH_ARG(PlanningOptions, planning) = {};
  /// Consecutive modules per stage (SequentialChainOptions::group_sizes); empty: one each.
  TORCH_ARG(std::vector<int64_t>, group_sizes) = {};
  /// On an input of another shape, dtype or device: plan for it (true) or refuse (false).
  TORCH_ARG(bool, replan_on_new_shape) = false;
  /// The plans kept, one per input shape, dtype and device (at least 1): a shape seen again reuses its
  /// plan; past this many the least recently used is dropped (and planned again if it comes back).
  TORCH_ARG(int64_t, max_cached_plans) = 32;
  /// With replan_on_new_shape: fit every shape's profiled costs with these terms (ShapeCosts::fit)
  /// once as many shapes as terms are profiled, and plan a new shape within the fitted range from the
  /// fit, unprofiled; one outside it is profiled and fitted in.
  TORCH_ARG(std::optional<ShapeTerms>, fit_shapes) = std::nullopt;
  /// A fit made before (ShapeCosts::from_json of a saved one): the shapes it covers are planned from
  /// it from the first forward on. Its chain must be this Sequential's.
  TORCH_ARG(std::optional<ShapeCosts>, shape_costs) = std::nullopt;
  /// An input's shape in the fit's dimensions (batch, length); default: its leading sizes, one per
  /// dimension.
  TORCH_ARG(std::function<std::vector<int64_t>(const at::Tensor&)>, shape_of) = nullptr;
};

class PlannedImpl : public torch::nn::Module {
 public:
  PlannedImpl(torch::nn::Sequential sequential, Budget budget, PlannedOptions options = {});

  /// Training mode with grad: runs under the plan (calibrating first if needed); otherwise plainly.
  at::Tensor forward(const at::Tensor& input);

  /// Profiles on `sample_input` (a batch with at least one element) and plans for the budget;
  /// returns the result. Call it outside any checkpoint (forward calibrates outside by itself).
  const PlanResult& calibrate(const at::Tensor& sample_input);
  bool calibrated() const { return !plans_.empty(); }
  /// The plan of the shape last run or calibrated, and its prediction (with the threads it was timed
  /// under, PlanResult::timed_under, and the measured choice); throws before calibration.
  const PlanResult& budget_plan() const;
  const Plan& plan() const { return budget_plan().plan; }
  const Budget& budget() const { return budget_; }
  /// Wall seconds that making the current plan took (profile, solve, verify, measured choice).
  double planning_seconds() const;
  /// Plans made since construction (a shape planned again after being dropped counts again).
  int64_t plans_made() const { return plans_made_; }
  /// Plans kept now, one per shape (at most PlannedOptions::max_cached_plans).
  size_t plans_cached() const { return plans_.size(); }
  /// Shapes profiled since construction; the others planned were planned from the fit.
  int64_t shapes_profiled() const { return shapes_profiled_; }
  /// Whether the current plan was solved on fitted costs (its shape not profiled).
  bool planned_from_fit() const;
  /// The fit new shapes are planned from (PlannedOptions::shape_costs, or fitted over the shapes
  /// profiled); save it with ShapeCosts::to_json to plan the next run's shapes without profiling.
  const std::optional<ShapeCosts>& shape_costs() const { return fit_; }
  /// The chain the plan runs on (one stage per module or group; no loss stage).
  SequentialChain& chain() { return *chain_; }
  torch::nn::Sequential sequential() const { return sequential_; }

  void train(bool on = true) override;
  void pretty_print(std::ostream& stream) const override;

 private:
  /// Throws unless the Sequential holds the modules it held when this Planned was made.
  void check_modules(const char* who) const;
  /// calibrate(), on a thread of its own: no checkpoint or backward of the caller's thread around it.
  void calibrate_outside(const at::Tensor& sample_input);
  /// The input's shape in the fit's dimensions; empty without a fit.
  std::vector<int64_t> fit_shape_of(const at::Tensor& input) const;

  torch::nn::Sequential sequential_;
  std::vector<const torch::nn::Module*> modules_;  ///< the Sequential's, when this Planned was made
  std::shared_ptr<SequentialChain> chain_;
  Budget budget_;
  PlannedOptions options_;
  /// A plan for one input shape, dtype and device.
  struct ShapePlan {
    std::vector<int64_t> sizes;
    at::ScalarType dtype = at::kFloat;
    c10::Device device = c10::kCPU;
    PlanResult result;
    double planning_seconds = 0;
    bool from_fit = false;
  };
  /// The entry for `input`'s shape, dtype and device; nullptr if none.
  ShapePlan* find_plan(const at::Tensor& input);
  std::vector<ShapePlan> plans_;  ///< least recently used first; the current plan last
  int64_t plans_made_ = 0, shapes_profiled_ = 0;
  std::optional<ShapeCosts> fit_;
  std::vector<ShapedCosts> profiled_;  ///< with fit_shapes: each shape profiled, fitted together
};

TORCH_MODULE(Planned);

}  // namespace remat
