// remat::Planned on inputs whose batch and length change every step: a stack of
// torch::nn::TransformerEncoderLayer (sequence first, so PlannedOptions::shape_of says which sizes
// are the batch and the length) under a share of each shape's unchecked peak. The first six shapes
// (two batches by three lengths) are profiled and fitted (planning/shape_costs.h); the others are
// planned from the fit, each verified by one measured step; the last lies beyond the fitted batches
// and is profiled. Each step prints how its plan was made, the time planning took, and its
// activation peak against its budget.
//   remat_planned_shapes_bench                 4 layers, d_model 128, 4 heads; 12 random shapes
//   remat_planned_shapes_bench --steps N --budget 40% --seed S
#include <chrono>
#include <iostream>
#include <random>
#include <set>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include "remat/autoplan/planned.h"
#include "remat/base/error.h"
#include "remat/memory/memory.h"

namespace nn = torch::nn;

int main(int argc, char** argv) try {
  CLI::App app("remat::Planned on inputs whose batch and length change every step.", "remat_planned_shapes_bench");
  int steps = 12;
  std::string budget = "50%";
  uint64_t seed = 1;
  app.add_option("--steps", steps, "steps of random shapes after the six profiled ones")->check(CLI::Range(1, 10000));
  app.add_option("--budget", budget, "the activation budget of every shape (a share is of that shape's peak)");
  app.add_option("--seed", seed, "the shapes' random generator");
  CLI11_PARSE(app, argc, argv);
  remat::install_cpu_memory_tracker();
  torch::manual_seed(0);
  nn::Sequential net;
  for (int i = 0; i < 4; ++i) {
    net->push_back(nn::TransformerEncoderLayer(nn::TransformerEncoderLayerOptions(128, 4).dim_feedforward(512)));
  }
  remat::Planned planned(net, remat::Budget::parse(budget),
                         remat::PlannedOptions()
                             .replan_on_new_shape(true)
                             .fit_shapes(remat::ShapeTerms::batch_and_length())
                             .shape_of([](const at::Tensor& x) {
                               return std::vector<int64_t>{x.size(1), x.size(0)};
                             }));
  for (auto& p : planned->parameters()) p.mutable_grad() = torch::zeros_like(p);  // as after a first step
  std::vector<std::pair<int64_t, int64_t>> shapes = {{2, 32}, {2, 96}, {2, 160}, {8, 32}, {8, 96}, {8, 160}};
  std::mt19937_64 rng(seed);
  for (int i = 0; i < steps; ++i) {
    shapes.emplace_back(std::uniform_int_distribution<int64_t>(2, 8)(rng),
                        std::uniform_int_distribution<int64_t>(32, 160)(rng));
  }
  shapes.emplace_back(12, 96);  // beyond the batches fitted
  std::set<std::pair<int64_t, int64_t>> seen;
  int over_budget = 0;
  double fitted_seconds = 0, profiled_seconds = 0;
  int fitted = 0, profiled = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto [batch, length] = shapes[i];
    const at::Tensor x = torch::randn({length, batch, 128});
    std::string how = "its plan reused";
    if (seen.insert(shapes[i]).second) {
      planned->calibrate(x);  // what forward does on a new shape; here outside the measured step
      const bool from_fit = planned->planned_from_fit();
      (from_fit ? fitted_seconds : profiled_seconds) += planned->planning_seconds();
      ++(from_fit ? fitted : profiled);
      std::ostringstream text;
      text << (from_fit ? "planned from the fit in " : "profiled and planned in ") << planned->planning_seconds()
           << " s";
      how = text.str();
    }
    const remat::StepMeasurement m = remat::measure_step([&] { return planned->forward(x).sum(); });
    const remat::PlanResult& r = planned->budget_plan();
    const bool fits = m.activation_peak_bytes() <= r.budget_bytes;
    over_budget += fits ? 0 : 1;
    std::cout << "step " << i + 1 << ": batch " << batch << ", length " << length << ": " << how << "; peak "
              << remat::format_bytes(m.activation_peak_bytes()) << (fits ? " <= " : " > ") << "budget "
              << remat::format_bytes(r.budget_bytes) << " (unchecked "
              << remat::format_bytes(r.measured_unchecked_peak_bytes) << "); step " << m.step_seconds << " s\n";
  }
  std::cout << profiled << " shapes profiled, " << profiled_seconds / std::max(profiled, 1) << " s each; " << fitted
            << " planned from the fit, " << fitted_seconds / std::max(fitted, 1) << " s each; " << over_budget
            << " steps over their budget\n";
  return over_budget == 0 ? 0 : 1;
} catch (const c10::Error& e) {
  std::cerr << "remat_planned_shapes_bench: " << e.what_without_backtrace() << "\n";
  return 1;
}
