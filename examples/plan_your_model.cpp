// Planning your own model under a memory budget: a Sequential, its loss, one call to make_plan,
// then an ordinary training loop whose steps run under the plan.
//
//   remat_plan_your_model              6 TransformerEncoderLayers, d_model 64, sequence 64, batch 8
//
// It prints where the plan came from, the plan, and each step's measured activation peak against
// the budget; it exits 1 where a step's peak passes the budget.
#include <cstdlib>
#include <iostream>

#include <torch/torch.h>

#include "remat/autoplan/make_plan.h"
#include "remat/chain/plan.h"
#include "remat/chain/sequential_chain.h"
#include "remat/memory/memory.h"

namespace nn = torch::nn;
namespace F = torch::nn::functional;

int main() try {
  at::set_num_threads(2);
  remat::install_cpu_memory_tracker();  // exact bytes on CPU: before the model's first allocation
  torch::manual_seed(0);
  nn::Sequential net;
  for (int i = 0; i < 6; ++i) {
    net->push_back(nn::TransformerEncoderLayer(nn::TransformerEncoderLayerOptions(64, 4).dim_feedforward(256)));
  }
  const at::Tensor x = torch::randn({64, 8, 64});  // (sequence, batch, d_model) embeddings
  const at::Tensor target = torch::randn({64, 8, 64});

  remat::SequentialChain chain(net, [&](const at::Tensor& out) { return F::mse_loss(out, target); });
  const remat::PlanResult planned = remat::make_plan(remat::PlanRequest::of_budget("40%"), {chain, x});
  std::cout << planned.source << "\n  plan: " << planned.plan.to_string() << "\n";

  torch::optim::Adam adam(net->parameters(), 1e-4);
  bool within = true;
  for (int step = 1; step <= 3; ++step) {
    net->zero_grad(/*set_to_none=*/false);  // gradients stay allocated between steps, as the budget assumes
    const remat::StepMeasurement m = remat::measure_step([&] { return remat::run_plan(chain, planned.plan, x); });
    adam.step();
    // The first step also allocates the gradients, which are not activations.
    if (step > 1) within = within && m.activation_peak_bytes() <= planned.budget_bytes;
    std::cout << "  step " << step << ": activation peak " << remat::format_bytes(m.activation_peak_bytes()) << " of "
              << remat::format_bytes(planned.budget_bytes) << "\n";
  }
  std::cout << (within ? "every step within the budget" : "a step passed the budget") << "\n";
  return within ? EXIT_SUCCESS : EXIT_FAILURE;
} catch (const c10::Error& e) {
  std::cerr << "error: " << e.what_without_backtrace() << "\n";
  return EXIT_FAILURE;
}
