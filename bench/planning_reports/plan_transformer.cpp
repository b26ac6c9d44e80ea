// Planning your own model: a stack of torch::nn::TransformerEncoderLayer on random embeddings.
//
// The ten lines a user writes are in train_under_budget(); the rest (budget_report.h)
// measures what the plan costs against what the planner predicted, beside the generic policies.
//
//   remat_plan_transformer            12 layers, d_model 256, 8 heads, sequence 128, batch 8
//   remat_plan_transformer --quick    a small configuration (what the tests run); --steps N: measured steps
//   remat_plan_transformer --modes    block, every:2 and the 50% plan, reentrant and non-reentrant
#include <iostream>

#include <torch/torch.h>

#include "remat/autoplan/make_plan.h"
#include "remat/base/threads.h"
#include "remat/memory/memory.h"
#include "remat/chain/sequential_chain.h"
#include "budget_report.h"

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct Config {
  int64_t layers = 12, d_model = 256, heads = 8, sequence = 128, batch = 8;
};

nn::Sequential make_transformer(const Config& c) {
  torch::manual_seed(0);
  nn::Sequential net;
  for (int64_t i = 0; i < c.layers; ++i) {
    net->push_back(
        "layer" + std::to_string(i),
        nn::TransformerEncoderLayer(
            nn::TransformerEncoderLayerOptions(c.d_model, c.heads).dim_feedforward(4 * c.d_model).dropout(0.1)));
  }
  return net;
}

// What a user writes: a chain over their Sequential with their loss, one call to plan, then an
// ordinary training loop that runs each step under the plan.
void train_under_budget(nn::Sequential net, const at::Tensor& x, const at::Tensor& target) {
  remat::SequentialChain chain(net, [&](const at::Tensor& out) { return F::mse_loss(out, target); });
  remat::PlanResult planned = remat::make_plan(remat::PlanRequest::of_budget("50%"), {chain, x});
  std::cout << "plan for 50%: " << planned.plan.to_string() << "\n  predicted activation peak "
            << remat::format_bytes(planned.prediction.peak_bytes) << " of " << remat::format_bytes(planned.budget_bytes)
            << "\n  " << planned.measured_choice.reason << "\n  timed under " << planned.timed_under << ", overhead "
            << remat_reports::percent(planned.predicted_overhead()) << "\n";
  torch::optim::Adam adam(net->parameters(), 1e-4);
  for (int step = 1; step <= 3; ++step) {
    adam.zero_grad();
    const remat::StepMeasurement m = remat::measure_step([&] { return remat::run_plan(chain, planned.plan, x); });
    adam.step();
    std::cout << "  step " << step << ": measured activation peak " << remat::format_bytes(m.activation_peak_bytes())
              << ", " << m.step_seconds << " s\n";
  }
}

int run(int argc, char** argv) {
  remat_reports::check_arguments(argc, argv, {"--quick", "--modes"}, {"--steps"});
  const bool quick = remat_reports::quick_mode(argc, argv);
  Config config;
  if (quick) config = Config{12, 32, 4, 32, 4};
  at::set_num_threads(2);                 // as LibTorch documents it; remat times around what it finds (threads.h)
  remat::keep_freed_memory_in_process();  // as docs/library.md advises CPU training programs
  std::cout << "remat_plan_transformer: " << config.layers << " x TransformerEncoderLayer(d_model " << config.d_model
            << ", heads " << config.heads << ", feed-forward " << 4 * config.d_model << ", dropout 0.1), sequence "
            << config.sequence << ", batch " << config.batch << ", " << remat::cpu_threads() << "\n";
  remat::install_cpu_memory_tracker();
  torch::manual_seed(1);
  const at::Tensor x = torch::randn({config.sequence, config.batch, config.d_model});  // (S, N, E) embeddings
  const at::Tensor target = torch::randn({config.sequence, config.batch, config.d_model});

  const remat_reports::ReportOptions options = remat_reports::report_options(argc, argv);
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--modes") {  // both checkpoint modes side by side
      return remat_reports::report_modes([&] { return make_transformer(config); },
                                         [&](const at::Tensor& out) { return F::mse_loss(out, target); }, x, options);
    }
  }
  train_under_budget(make_transformer(config), x, target);
  std::cout << "\n";
  return remat_reports::report_budgets([&] { return make_transformer(config); },
                                       [&](const at::Tensor& out) { return F::mse_loss(out, target); }, x, options);
}

int main(int argc, char** argv) { return remat_reports::run_report(run, argc, argv); }
