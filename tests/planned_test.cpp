// remat/autoplan/planned.h: a Sequential planned for a budget, calibrated on its first training forward.
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/memory/memory.h"
#include "remat/autoplan/planned.h"
#include "remat/checkpoint/checkpoint.h"
#include "support/compare.h"
#include "support/planning.h"
#include "support/sequential_models.h"

namespace nn = torch::nn;
namespace F = torch::nn::functional;
using remat::testing::bitwise_equal;
using remat::testing::convnet;
using remat::testing::count_segments;
using remat::testing::mlp;
using remat::testing::ReproducibleConvolutions;

namespace {

remat::PlannedOptions quick_planning() { return remat::PlannedOptions().planning(remat::testing::quick_planning()); }

}  // namespace

TEST(Planned, CalibratesOnItsFirstTrainingForwardAndKeepsParameterNames) {
  const ReproducibleConvolutions reproducible;
  nn::Sequential plain = convnet();
  remat::Planned planned(convnet(), "92%", remat::PlannedOptions().planning(remat::testing::quick_planning()));
  std::vector<std::string> plain_names, planned_names;
  for (const auto& p : plain->named_parameters()) plain_names.push_back(p.key());
  for (const auto& p : planned->named_parameters()) planned_names.push_back(p.key());
  EXPECT_EQ(plain_names, planned_names);
  EXPECT_EQ(plain->named_buffers().size(), planned->named_buffers().size());
  EXPECT_FALSE(planned->calibrated());
  REMAT_EXPECT_ERROR(planned->plan(), "not calibrated yet");

  const at::Tensor x = torch::randn({8, 3, 16, 16});
  const at::Tensor y = torch::randint(0, 10, {8}, torch::kLong);
  for (int step = 0; step < 3; ++step) {
    for (nn::Sequential net : {plain, planned->sequential()}) {
      net->zero_grad();
      torch::manual_seed(step);
      const at::Tensor out = net.ptr() == plain.ptr() ? plain->forward(x) : planned->forward(x);
      F::cross_entropy(out, y).backward();
    }
  }
  ASSERT_TRUE(planned->calibrated());
  SCOPED_TRACE("plan " + planned->plan().to_string() + " (" + to_string(planned->plan().mode) + ")");
  for (size_t i = 0; i < plain->parameters().size(); ++i) {
    EXPECT_TRUE(bitwise_equal(plain->parameters()[i], planned->parameters()[i])) << "calibration left parameter " << i;
  }
  EXPECT_LE(planned->budget_plan().measured_peak_bytes, planned->budget_plan().budget_bytes);
  EXPECT_GE(count_segments(planned->plan().items), 1) << planned->plan().to_string();
  remat::testing::expect_same_grads(remat::testing::parameter_grads(*plain), remat::testing::parameter_grads(*planned));
  for (size_t i = 0; i < plain->buffers().size(); ++i) {
    EXPECT_TRUE(bitwise_equal(plain->buffers()[i], planned->buffers()[i])) << i;
  }
  // A state saved from the plain model loads into the planned one.
  std::stringstream saved;
  torch::save(plain, saved);
  torch::load(planned, saved);

  // Another batch size changes every activation: refused, unless re-planning is asked for.
  REMAT_EXPECT_ERROR(
      planned->forward(torch::randn({2, 3, 16, 16})),
      "Planned: the plan was made for inputs of Float[8, 3, 16, 16] on cpu but this input is Float[2, 3, 16, 16]");
  planned->eval();
  EXPECT_EQ(planned->forward(torch::randn({2, 3, 16, 16})).sizes(), (std::vector<int64_t>{2, 10}))
      << "eval runs plainly";
  remat::Planned replanning(
      convnet(), "92%", remat::PlannedOptions().replan_on_new_shape(true).planning(remat::testing::quick_planning()));
  replanning->forward(x);
  const int64_t first_budget = replanning->budget_plan().unchecked.peak_bytes;
  replanning->forward(torch::randn({16, 3, 16, 16}));
  EXPECT_GT(replanning->budget_plan().unchecked.peak_bytes, first_budget);
}

// Issue 39: a module appended to the Sequential after the Planned was made was silently skipped.
TEST(Planned, RefusesASequentialChangedAfterItWasMade) {
  nn::Sequential net = mlp(1);
  remat::Planned planned(net, "100%", quick_planning());
  const at::Tensor x = torch::randn({4, 32});
  planned->forward(x).sum().backward();
  ASSERT_TRUE(planned->calibrated());
  net->push_back(nn::Linear(10, 3));
  const std::string changed = "the Sequential has changed since this Planned was made: it had 5 modules and now has 6";
  REMAT_EXPECT_ERROR(planned->forward(x), "Planned::forward: " + std::string(changed));
  REMAT_EXPECT_ERROR(planned->calibrate(x), "Planned::calibrate: " + std::string(changed));
  REMAT_EXPECT_ERROR(planned->forward(x), "first differing at module 5");
  REMAT_EXPECT_ERROR(planned->forward(x), "make a Planned of it");
  planned->eval();
  REMAT_EXPECT_ERROR(planned->forward(x), changed);  // evaluation skipped it as well
  // What the message advises: a Planned of the finished Sequential runs all its modules.
  remat::Planned fresh(net, "100%", quick_planning());
  const at::Tensor y = fresh->forward(x);
  EXPECT_EQ(y.size(1), 3) << "the appended module ran";
  y.sum().backward();
}

// Issue 39: calibrating on a batch of 0 rows was accepted.
TEST(Planned, RefusesToCalibrateOnABatchWithoutElements) {
  remat::Planned planned(mlp(1), "100%", quick_planning());
  const std::string empty = "the sample batch of shape Float[0, 32] on cpu has no elements (0 rows?)";
  REMAT_EXPECT_ERROR(planned->calibrate(torch::randn({0, 32})), "Planned::calibrate: " + empty);
  REMAT_EXPECT_ERROR(planned->forward(torch::randn({0, 32})), empty);
  REMAT_EXPECT_ERROR(planned->forward(torch::randn({0, 32})), "Calibrate on a batch of the size you train with");
  EXPECT_FALSE(planned->calibrated());
  planned->forward(torch::randn({4, 32})).sum().backward();
  EXPECT_TRUE(planned->calibrated());
}

// Issue 39: a Planned's first forward inside a checkpoint (its recompute, or a non-reentrant
// checkpoint's forward) ended in an internal error. It calibrates outside, on a thread of its own,
// and its gradients are the plain Sequential's.
TEST(Planned, ItsFirstForwardMayRunInsideACheckpointOfEitherMode) {
  for (const bool reentrant : {true, false}) {
    SCOPED_TRACE(reentrant ? "reentrant" : "non-reentrant");
    nn::Sequential plain = mlp(2);
    remat::Planned planned(mlp(2), "90%", quick_planning());
    const at::Tensor x = torch::randn({64, 32});
    const auto options = remat::CheckpointOptions().use_reentrant(reentrant);
    for (int step = 0; step < 2; ++step) {
      for (const bool is_planned : {false, true}) {
        torch::manual_seed(100 + step);
        const at::Tensor in = x.clone().requires_grad_(true);
        const at::Tensor out = remat::checkpoint(
            [&](const at::Tensor& t) { return is_planned ? planned->forward(t) : plain->forward(t); }, in, options);
        out.pow(2).sum().backward();
      }
      ASSERT_TRUE(planned->calibrated());
    }
    remat::testing::expect_same_grads(remat::testing::parameter_grads(*plain),
                                      remat::testing::parameter_grads(*planned));
  }
}

TEST(Planned, ItsOutputStillBackPropagatesWhenThePlannedModuleIsGone) {
  const at::Tensor x = torch::randn({8, 3, 16, 16});
  nn::Sequential net = convnet();
  at::Tensor out;
  {
    remat::Planned planned(net, "92%", remat::PlannedOptions().planning(remat::testing::quick_planning()));
    out = planned->forward(x);
    ASSERT_GE(count_segments(planned->plan().items), 1) << planned->plan().to_string();
  }
  out.sum().backward();
  for (const auto& p : net->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_TRUE(torch::isfinite(p.grad()).all().item<bool>());
  }
}

// Issue 42: a batch whose size and length change every step. Each new shape is planned once (on the
// first step of that shape) and kept; a shape seen again runs at once under its own plan; every
// step stays within its shape's budget; past max_cached_plans the least recently used is dropped.
TEST(Planned, KeepsAPlanPerInputShapeAndReusesIt) {
  remat::install_cpu_memory_tracker();
  remat::Planned planned(
      mlp(6), "80%",
      remat::PlannedOptions().replan_on_new_shape(true).max_cached_plans(2).planning(remat::testing::quick_planning()));
  const std::vector<std::vector<int64_t>> shapes = {{8, 32}, {2, 5, 32}, {8, 32}, {2, 5, 32}, {16, 32}, {8, 32}};
  const std::vector<int64_t> made_after = {1, 2, 2, 2, 3, 4};  // {8, 32} dropped for {16, 32}, then planned again
  std::vector<int64_t> unchecked_peaks;
  for (size_t step = 0; step < shapes.size(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const at::Tensor x = torch::randn(shapes[step]);
    const remat::StepMeasurement m = remat::measure_step([&] { return planned->forward(x).sum(); });
    ASSERT_EQ(planned->plans_made(), made_after[step]);
    EXPECT_LE(planned->plans_cached(), 2u);
    const remat::PlanResult& r = planned->budget_plan();
    if (step == 0 || made_after[step] > made_after[step - 1]) {
      EXPECT_GT(planned->planning_seconds(), 0);
      continue;  // a planning step: its measurement holds the profiler's memory as well
    }
    // A step under a plan already made: its activation peak within the budget of its shape.
    EXPECT_LE(m.activation_peak_bytes(), r.budget_bytes) << r.plan.to_string();
    unchecked_peaks.push_back(r.measured_unchecked_peak_bytes);
  }
  ASSERT_EQ(unchecked_peaks.size(), 2u);  // steps 2 and 3, reusing the plans of steps 0 and 1
  EXPECT_NE(unchecked_peaks[0], unchecked_peaks[1]) << "each shape has a plan of its own";
  std::ostringstream printed;
  planned->pretty_print(printed);
  EXPECT_NE(printed.str().find("2 shapes planned"), std::string::npos) << printed.str();
  REMAT_EXPECT_ERROR(remat::Planned(mlp(1), "70%", remat::PlannedOptions().max_cached_plans(0)),
                     "max_cached_plans must be at least 1");
}

// Batch and length change every step: the first shapes are profiled and fitted, the others planned
// from the fit (no profiling), each verified by a measured step; every step's peak is within its
// shape's budget; a shape beyond the fitted range is profiled, not refused; the fit, saved and read
// back, plans a new Planned's first shape without profiling.
TEST(Planned, PlansNewShapesFromCostsFittedOverTheShapesProfiled) {
  remat::install_cpu_memory_tracker();
  const auto options = [] {
    return remat::PlannedOptions()
        .replan_on_new_shape(true)
        .fit_shapes(remat::ShapeTerms::batch_and_length())
        .planning(remat::testing::quick_planning());
  };
  remat::Planned planned(mlp(6), "80%", options());
  // Gradients allocated up front, as after a first step: a step's activation peak is then its own.
  for (auto& p : planned->parameters()) p.mutable_grad() = torch::zeros_like(p);
  // {1, B} x {1, T, T^2}: the six terms' values differ on these six shapes.
  const std::vector<std::vector<int64_t>> profiled = {{2, 4}, {2, 8}, {2, 12}, {4, 4}, {4, 8}, {4, 12}};
  const std::vector<std::vector<int64_t>> fitted = {{3, 5}, {2, 10}, {4, 6}, {3, 11}, {3, 7}};
  auto step = [&](const std::vector<int64_t>& shape) {
    const at::Tensor x = torch::randn({shape[0], shape[1], 32});
    planned->calibrate(x);  // what forward does on a new shape; outside the measurement below
    const remat::StepMeasurement m = remat::measure_step([&] { return planned->forward(x).sum(); });
    const remat::PlanResult& r = planned->budget_plan();
    EXPECT_LE(m.activation_peak_bytes(), r.budget_bytes) << r.plan.to_string();
    EXPECT_GT(planned->planning_seconds(), 0);
  };
  for (size_t i = 0; i < profiled.size(); ++i) {
    SCOPED_TRACE("profiled shape " + std::to_string(i));
    step(profiled[i]);
    EXPECT_FALSE(planned->planned_from_fit());
    EXPECT_EQ(planned->shape_costs().has_value(), i + 1 == profiled.size()) << "fitted once there are six shapes";
  }
  for (const auto& shape : fitted) {
    SCOPED_TRACE("fitted shape " + std::to_string(shape[0]) + "x" + std::to_string(shape[1]));
    step(shape);
    EXPECT_TRUE(planned->planned_from_fit());
    EXPECT_EQ(planned->shapes_profiled(), 6);
  }
  step({5, 8});  // beyond the batches fitted: profiled once more, and fitted in
  EXPECT_FALSE(planned->planned_from_fit());
  EXPECT_EQ(planned->shapes_profiled(), 7);
  ASSERT_TRUE(planned->shape_costs()->covers({5, 12}));
  EXPECT_EQ(planned->plans_made(), 12);

  // The fit is a file: a new Planned given it plans its first shape from it.
  const remat::ShapeCosts saved = remat::ShapeCosts::from_json(planned->shape_costs()->to_json());
  remat::Planned next(mlp(6), "80%", options().shape_costs(saved));
  const at::Tensor x = torch::randn({3, 9, 32});
  next->forward(x).sum().backward();
  EXPECT_TRUE(next->planned_from_fit());
  EXPECT_EQ(next->shapes_profiled(), 0);
  std::ostringstream printed;
  next->pretty_print(printed);
  EXPECT_NE(printed.str().find("costs fitted over 7 shapes"), std::string::npos) << printed.str();

  // No plan on the fitted costs within a budget: the shape is profiled, and the error is the profile's.
  remat::Planned tight(mlp(6), "1%", options().shape_costs(saved));
  REMAT_EXPECT_ERROR(tight->forward(torch::randn({3, 9, 32})), "Give at least that");
  EXPECT_EQ(tight->shapes_profiled(), 1);

  REMAT_EXPECT_ERROR(remat::Planned(mlp(1), "70%", remat::PlannedOptions().fit_shapes(remat::ShapeTerms::batch_only())),
                     "set replan_on_new_shape as well");
  remat::Planned wrong(mlp(2), "70%", options().shape_of([](const at::Tensor&) { return std::vector<int64_t>{4}; }));
  REMAT_EXPECT_ERROR(wrong->forward(torch::randn({2, 4, 32})), "the fit needs 2 positive sizes");
}
