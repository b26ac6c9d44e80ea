// `remat demo`: one model, trained one step at a time with and without checkpointing, and what
// each way costs in activation memory and step time.
#include "demo_command.h"

#include <algorithm>
#include <cmath>
#include <iostream>

#include <unistd.h>

#include <ATen/Parallel.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "remat/statistics.h"
#include "remat/checkpointed.h"
#include "remat/cpu_threads.h"
#include "remat/memory.h"
#include "remat/models/layer_stack.h"
#include "table.h"

namespace remat::cli {
namespace {

struct Strategy {
  std::string name;
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::vector<double> step_seconds;
  StepMeasurement last;
};

void run_demo(const DemoOptions& o) {
  const std::string threads = set_cpu_threads(o.threads);
  install_cpu_memory_tracker();
  torch::manual_seed(o.seed);
  models::LayerStack stack(o.layers, o.channels, o.dropout);
  torch::nn::Sequential sequential;
  for (auto& block : stack->blocks) sequential->push_back(block);
  const at::Tensor x = torch::randn({o.batch, o.tokens, o.channels});
  const auto sqrt_segments = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(o.layers))));

  std::vector<Strategy> strategies = {
      {"none", [&](const at::Tensor& in) { return stack->forward(in, models::StackMode::plain); }, {}, {}},
      {"every layer", [&](const at::Tensor& in) { return stack->forward(in, models::StackMode::checkpoint_each_layer); }, {}, {}},
      {"sequential:" + std::to_string(sqrt_segments),
       [&](const at::Tensor& in) { return checkpoint_sequential(sequential, sqrt_segments, in); }, {}, {}},
      {"nested pairs", [&](const at::Tensor& in) { return stack->forward(in, models::StackMode::checkpoint_pairs_nested); }, {}, {}},
  };

  std::cout << "remat demo: " << o.layers << " residual layers (LayerNorm, Linear " << o.channels << "->"
            << 4 * o.channels << ", GELU, Linear, dropout " << o.dropout << "), input " << o.batch << "x"
            << o.tokens << "x" << o.channels << " fp32, " << threads << ", " << o.steps
            << " measured steps per strategy after one warm-up, interleaved\n";
  const at::Tensor input = x.clone().requires_grad_(true);
  const bool progress_on_terminal = isatty(STDERR_FILENO) != 0;
  for (int64_t step = -1; step < o.steps; ++step) {
    for (auto& s : strategies) {
      stack->zero_grad();
      input.mutable_grad().reset();
      s.last = measure_step([&] { return s.forward(input).pow(2).mean(); });
      if (step >= 0) s.step_seconds.push_back(s.last.step_seconds);
      if (progress_on_terminal) {
        std::cerr << "\r  step " << (step < 0 ? std::string("warm-up") : std::to_string(step + 1)) << "/" << o.steps
                  << " " << s.name << "            " << std::flush;
      }
    }
  }
  if (progress_on_terminal) std::cerr << "\r" << std::string(60, ' ') << "\r";

  const auto& none = strategies.front();
  Table table({"strategy", "held after forward MiB", "activation peak MiB", "peak saved", "step s (median)", "time vs none"});
  for (const auto& s : strategies) {
    const double saved = 1.0 - static_cast<double>(s.last.activation_peak_bytes()) /
                                   static_cast<double>(none.last.activation_peak_bytes());
    table.add_row({s.name, mib(s.last.activation_bytes_at_end_of_forward()), mib(s.last.activation_peak_bytes()),
                   fixed(100.0 * saved, 1) + "%", fixed(median(s.step_seconds), 3),
                   fixed(median(s.step_seconds) / median(none.step_seconds), 2) + "x"});
  }
  table.print(std::cout);
  std::cout << "Activation figures are exact bytes from the tracking allocator, relative to what was held before the "
               "forward.\n";
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto options = std::make_shared<DemoOptions>();
  CLI::App* demo = app.add_subcommand("demo", "Show the memory checkpointing saves on a stack of residual layers");
  demo->add_option("--layers", options->layers, "Number of residual layers")->capture_default_str()->check(CLI::Range(1, 1024));
  demo->add_option("--channels", options->channels, "Channels per token")->capture_default_str()->check(CLI::Range(1, 65536));
  demo->add_option("--batch", options->batch, "Batch size")->capture_default_str()->check(CLI::Range(1, 65536));
  demo->add_option("--tokens", options->tokens, "Tokens per sequence")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  demo->add_option("--dropout", options->dropout, "Dropout probability")->capture_default_str()->check(CLI::Range(0.0, 0.99));
  demo->add_option("--steps", options->steps, "Measured steps per strategy")->capture_default_str()->check(CLI::Range(1, 1000));
  demo->add_option("--threads", options->threads, "Intra-op threads")->capture_default_str()->check(CLI::Range(1, 256));
  demo->add_option("--seed", options->seed, "Random seed")->capture_default_str();
  demo->callback([options] { run_demo(*options); });
}

}  // namespace remat::cli
