// Shared by the graph-planning examples (unet.cpp, encoder_decoder.cpp): two copies of one model
// trained in lockstep from the same RNG state, one plainly and one under remat::PlannedStep, so
// that every planned step's gradients can be compared bit for bit with the plain step's and its
// peak with the budget. A user's program needs only the planned half (see the examples' tops).
#pragma once

#include <functional>
#include <iostream>
#include <string>

#include <torch/torch.h>

#include "remat/graph/planned_step.h"
#include "remat/memory/memory.h"

namespace example {

struct StepResult {
  at::Tensor loss;
  int64_t peak = 0;  // activation bytes: forward and backward, above what was held before
};

inline StepResult step_of(torch::nn::Module& model, uint64_t seed, const std::function<at::Tensor()>& forward) {
  model.zero_grad(/*set_to_none=*/false);
  torch::manual_seed(seed);
  remat::reset_peak_memory();
  const int64_t before = remat::memory_stats().current_bytes;
  StepResult r;
  r.loss = forward();
  r.loss.backward();
  r.peak = remat::memory_stats().peak_bytes - before;
  return r;
}

inline bool same_gradients(torch::nn::Module& a, torch::nn::Module& b) {
  const auto pa = a.parameters(), pb = b.parameters();
  bool same = pa.size() == pb.size();
  for (size_t i = 0; same && i < pa.size(); ++i) same = pa[i].grad().equal(pb[i].grad());
  return same;
}

// Trains `plain` and `planned` (equal copies) for `steps` steps; `loss_of(model)` is one forward.
// Prints the plan and each step; returns whether every planned step stayed within the budget with
// gradients equal to the plain step's.
template <typename Model, typename LossOf>
bool train_side_by_side(const std::string& budget, Model plain, Model planned, LossOf loss_of, int steps) {
  remat::PlannedStep step(budget);  // the first run records the step, the next ones run under the plan
  torch::optim::SGD plain_sgd(plain->parameters(), 0.01), planned_sgd(planned->parameters(), 0.01);
  bool ok = true;
  for (int i = 0; i < steps; ++i) {
    const uint64_t seed = 100 + static_cast<uint64_t>(i);
    const StepResult expected = step_of(*plain, seed, [&] { return loss_of(plain); });
    const StepResult got = step_of(*planned, seed, [&] { return step.run([&] { return loss_of(planned); }); });
    const bool equal = same_gradients(*plain, *planned) && got.loss.equal(expected.loss);
    std::cout << "  budget " << budget << ", step " << i + 1 << ": loss " << got.loss.item<double>() << ", peak "
              << remat::format_bytes(got.peak) << " (plain " << remat::format_bytes(expected.peak) << ")";
    if (step.last_run_recorded()) {
      std::cout << ", recorded";
    } else {
      const bool within = got.peak <= step.plan().budget_bytes;
      std::cout << ", budget " << remat::format_bytes(step.plan().budget_bytes) << " predicted "
                << remat::format_bytes(step.plan().predicted_peak_bytes) << (within ? ", within" : ", OVER");
      ok = ok && within;
    }
    std::cout << (equal ? ", gradients equal\n" : ", GRADIENTS DIFFER\n");
    ok = ok && equal;
    plain_sgd.step();
    planned_sgd.step();
  }
  if (step.planned()) std::cout << step.plan().to_string();
  return ok;
}

}  // namespace example
