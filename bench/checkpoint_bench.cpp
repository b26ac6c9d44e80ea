// What checkpointing costs in time: (1) the fixed cost of one checkpoint call on a tiny function,
// and (2) the step-time ratio checkpointed / unchecked on the 8-layer residual stack.
// Prints a table and, with --json FILE, writes the same figures as JSON. --skip-stack runs (1) only
// (bench/pytorch_side_by_side.py uses it to compare with PyTorch's checkpoint on the same function).
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "remat/internal/statistics.h"
#include "remat/checkpoint/checkpoint.h"
#include "remat/memory/memory.h"
#include "remat/base/threads.h"
#include "remat/memory/memory.h"
#include "remat/models/layer_stack.h"

namespace {

using remat::seconds_per_call;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"remat checkpoint benchmark: per-call overhead and step-time ratio"};
  int calls = 2000, rounds = 7, steps = 5, threads = 2;
  int64_t layers = 8, channels = 256, batch = 8, tokens = 256;
  std::string json_path;
  bool skip_stack = false;
  app.add_option("--calls", calls, "Calls per round of the per-call benchmark")->capture_default_str();
  app.add_option("--rounds", rounds, "Interleaved rounds of the per-call benchmark")->capture_default_str();
  app.add_option("--steps", steps, "Measured training steps per strategy")->capture_default_str();
  app.add_option("--layers", layers)->capture_default_str();
  app.add_option("--channels", channels)->capture_default_str();
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--tokens", tokens)->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--json", json_path, "Also write the figures to this JSON file");
  app.add_flag("--skip-stack", skip_stack, "Run only the per-call benchmark on the tiny function");
  CLI11_PARSE(app, argc, argv);
  std::cout << "threads: " << remat::set_cpu_threads(threads) << "\n";
  remat::keep_freed_memory_in_process();

  // (1) Tiny function: 16 floats, two ops. Forward-only and forward+backward, interleaved rounds.
  at::Tensor w = torch::randn({16}, torch::requires_grad());
  at::Tensor x = torch::randn({16}, torch::requires_grad());
  auto tiny = [&](const at::Tensor& in) { return (in * w).tanh(); };
  std::vector<double> direct_fwd, ckpt_fwd, direct_step, ckpt_step, nr_fwd, nr_step;
  const auto non_reentrant = remat::CheckpointOptions().use_reentrant(false);
  for (int r = 0; r < rounds; ++r) {
    direct_fwd.push_back(seconds_per_call(calls, [&] { tiny(x); }));
    ckpt_fwd.push_back(seconds_per_call(calls, [&] { remat::checkpoint(tiny, x); }));
    nr_fwd.push_back(seconds_per_call(calls, [&] { remat::checkpoint(tiny, x, non_reentrant); }));
    direct_step.push_back(seconds_per_call(calls, [&] { tiny(x).sum().backward(); }));
    ckpt_step.push_back(seconds_per_call(calls, [&] { remat::checkpoint(tiny, x).sum().backward(); }));
    nr_step.push_back(seconds_per_call(calls, [&] { remat::checkpoint(tiny, x, non_reentrant).sum().backward(); }));
  }
  const double us = 1e6;
  std::cout << "Per call on a tiny function (16 floats, mul+tanh), median of " << rounds << " rounds of " << calls
            << " calls:\n"
            << "  forward only:        direct " << remat::median(direct_fwd) * us << " us, checkpoint "
            << remat::median(ckpt_fwd) * us << " us, overhead "
            << (remat::median(ckpt_fwd) - remat::median(direct_fwd)) * us << " us\n"
            << "  forward + backward:  direct " << remat::median(direct_step) * us << " us, checkpoint "
            << remat::median(ckpt_step) * us << " us, overhead "
            << (remat::median(ckpt_step) - remat::median(direct_step)) * us << " us\n"
            << "  non-reentrant:       forward " << remat::median(nr_fwd) * us << " us (overhead "
            << (remat::median(nr_fwd) - remat::median(direct_fwd)) * us << " us), forward + backward "
            << remat::median(nr_step) * us << " us (overhead "
            << (remat::median(nr_step) - remat::median(direct_step)) * us << " us)\n";

  nlohmann::json j = {{"tiny_forward_direct_us", remat::median(direct_fwd) * us},
                      {"tiny_forward_checkpoint_us", remat::median(ckpt_fwd) * us},
                      {"tiny_step_direct_us", remat::median(direct_step) * us},
                      {"tiny_step_checkpoint_us", remat::median(ckpt_step) * us},
                      {"tiny_forward_checkpoint_nonreentrant_us", remat::median(nr_fwd) * us},
                      {"tiny_step_checkpoint_nonreentrant_us", remat::median(nr_step) * us}};
  if (skip_stack) {
    if (!json_path.empty()) std::ofstream(json_path) << j.dump(2) << "\n";
    return 0;
  }

  // (2) Step time of the residual stack, plain vs checkpoint per layer, interleaved.
  torch::manual_seed(0);
  remat::models::LayerStack stack(layers, channels, 0.1);
  at::Tensor input = torch::randn({batch, tokens, channels}).requires_grad_(true);
  std::vector<double> plain_s, ckpt_s, plain_fwd, ckpt_fwd_s;
  remat::install_cpu_memory_tracker();
  for (int step = -1; step < steps; ++step) {
    for (auto mode : {remat::models::StackMode::plain, remat::models::StackMode::checkpoint_each_layer}) {
      stack->zero_grad();
      auto m = remat::measure_step([&] { return stack->forward(input, mode).pow(2).mean(); });
      if (step < 0) continue;
      (mode == remat::models::StackMode::plain ? plain_s : ckpt_s).push_back(m.step_seconds);
      (mode == remat::models::StackMode::plain ? plain_fwd : ckpt_fwd_s).push_back(m.forward_seconds);
    }
  }
  std::cout << "Step of " << layers << " residual layers, " << batch << "x" << tokens << "x" << channels
            << ", median of " << steps << " interleaved steps:\n"
            << "  unchecked " << remat::median(plain_s) << " s (forward " << remat::median(plain_fwd)
            << " s), checkpoint per layer " << remat::median(ckpt_s) << " s (forward " << remat::median(ckpt_fwd_s)
            << " s), ratio " << remat::median(ckpt_s) / remat::median(plain_s) << "\n";

  if (!json_path.empty()) {
    j["stack_step_unchecked_s"] = remat::median(plain_s);
    j["stack_step_checkpointed_s"] = remat::median(ckpt_s);
    j["stack_step_ratio"] = remat::median(ckpt_s) / remat::median(plain_s);
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  return 0;
}
