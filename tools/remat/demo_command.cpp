// `remat demo`: one model, trained one step at a time with and without checkpointing, and what
// each way costs in activation memory and step time.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include <ATen/Parallel.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "commands.h"
#include "model_flags.h"
#include "progress.h"
#include "remat/checkpoint/checkpointed.h"
#include "remat/base/error.h"
#include "remat/measure/plan_measurement.h"
#include "remat/internal/statistics.h"
#include "remat/memory/memory.h"
#include "remat/base/threads.h"
#include "remat/memory/memory.h"
#include "remat/models/layer_stack.h"
#include "remat/internal/table.h"

namespace remat::cli {
namespace {

struct DemoFlags {
  ModelFlags model;
  int measure_steps = 3;
  bool json = false;
};

struct Strategy {
  std::string name;
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::vector<double> step_seconds;
  StepMeasurement last;
};

// One warm-up round, then `steps` measured ones, each strategy one step per round.
void measure_strategies(std::vector<Strategy>& strategies, models::LayerStack& stack, const at::Tensor& input,
                        int64_t steps) {
  Progress progress("round", steps + 1, steps + 1);
  for (int64_t step = -1; step < steps; ++step) {
    progress.update(step + 2, step < 0 ? "warm-up" : "measured");
    for (auto& s : strategies) {
      stack->zero_grad();
      input.mutable_grad().reset();
      s.last = measure_step([&] { return s.forward(input).pow(2).mean(); });
      if (step >= 0) s.step_seconds.push_back(s.last.step_seconds);
    }
  }
}

// The strategies' bytes and times against the first (none); the JSON too under --json.
void print_strategies(const std::vector<Strategy>& strategies, int64_t steps, bool json, std::ostream& out) {
  const auto& none = strategies.front();
  PlanMeasurement none_steps;
  none_steps.all_step_seconds = none.step_seconds;
  Table table({{"strategy", "strategy"},
               {"held_after_forward_bytes", "held after forward"},
               {"activation_peak_bytes", "activation peak"},
               {"peak_saved_fraction", "peak saved"},
               {"median_step_seconds", "step s (median)"},
               {"step_time_ratio", "time vs none"}});
  for (const auto& s : strategies) {
    const double saved = 1.0 - static_cast<double>(s.last.activation_peak_bytes()) /
                                   static_cast<double>(none.last.activation_peak_bytes());
    PlanMeasurement measured;
    measured.all_step_seconds = s.step_seconds;
    const double ratio = paired_time_ratio(measured, none_steps);  // per round: drift cancels
    table.add_row(
        {s.name,
         {format_bytes(s.last.activation_bytes_at_end_of_forward()), s.last.activation_bytes_at_end_of_forward()},
         {format_bytes(s.last.activation_peak_bytes()), s.last.activation_peak_bytes()},
         {fixed(100.0 * saved, 1) + "%", saved},
         {fixed(median(s.step_seconds), 3), median(s.step_seconds)},
         {fixed(ratio, 2) + "x", ratio}});
  }
  table.print(out);
  if (json) std::cout << nlohmann::json{{"strategies", table.json()}, {"measured_steps", steps}}.dump(2) << "\n";
  out << "Activation figures are exact bytes from the tracking allocator, relative to what was held before the "
         "forward.\n";
}

void run_demo(DemoFlags& flags) {
  flags.model.apply_preset();
  const auto& m = flags.model.options.model;
  const struct {
    int64_t layers, channels, batch, tokens;
    double dropout;
    int64_t steps;
    int threads;
    uint64_t seed;
  } o{m.layers(),  m.hidden(),          flags.model.options.batch,   m.sequence(),
      m.dropout(), flags.measure_steps, flags.model.options.threads, flags.model.options.seed};
  REMAT_CHECK(o.layers >= 1 && o.layers <= 1024, "--layers must be in [1, 1024], got ", o.layers, ".");
  REMAT_CHECK(o.channels >= 1 && o.channels <= 65536, "--hidden must be in [1, 65536], got ", o.channels, ".");
  REMAT_CHECK(o.batch >= 1 && o.batch <= 65536, "--batch must be in [1, 65536], got ", o.batch, ".");
  REMAT_CHECK(o.tokens >= 1 && o.tokens <= (1 << 20), "--seq must be in [1, 1048576], got ", o.tokens, ".");
  REMAT_CHECK(o.dropout >= 0 && o.dropout <= 0.99, "--dropout must be in [0, 0.99], got ", o.dropout, ".");
  REMAT_CHECK(o.threads >= 1 && o.threads <= 256, "--threads must be in [1, 256], got ", o.threads, ".");
  {
    // Refused before allocating, rather than by LibTorch's allocator: the weights and their
    // gradients (8 C^2 a layer), and the unchecked run's activations (about 12 BTC a layer: the
    // norm, the 4C-wide product and its GELU, the output and its dropout mask), in fp32.
    const double channels = static_cast<double>(o.channels), tokens = static_cast<double>(o.batch * o.tokens);
    const double bytes = 4.0 * static_cast<double>(o.layers) * (2 * 8 * channels * channels + 12 * tokens * channels) +
                         4.0 * 2 * tokens * channels;
    check_fits_in_machine_memory(bytes,
                                 "a residual stack of layers " + std::to_string(o.layers) + ", hidden " +
                                     std::to_string(o.channels) + ", batch " + std::to_string(o.batch) + ", seq " +
                                     std::to_string(o.tokens),
                                 "Lower --layers, --hidden, --batch or --seq.");
  }
  std::ostream& out = human_output(flags.json);
  const std::string threads = set_cpu_threads(o.threads).to_string();
  install_cpu_memory_tracker();
  torch::manual_seed(o.seed);
  models::LayerStack stack(o.layers, o.channels, o.dropout);
  torch::nn::Sequential sequential;
  for (auto& block : stack->blocks) sequential->push_back(block);
  const at::Tensor x = torch::randn({o.batch, o.tokens, o.channels});
  const auto sqrt_segments = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(o.layers))));

  std::vector<Strategy> strategies = {
      {"none", [&](const at::Tensor& in) { return stack->forward(in, models::StackMode::plain); }, {}, {}},
      {"every layer",
       [&](const at::Tensor& in) { return stack->forward(in, models::StackMode::checkpoint_each_layer); },
       {},
       {}},
      {"sequential:" + std::to_string(sqrt_segments),
       [&](const at::Tensor& in) { return checkpoint_sequential(sequential, sqrt_segments, in); },
       {},
       {}},
      {"nested pairs",
       [&](const at::Tensor& in) { return stack->forward(in, models::StackMode::checkpoint_pairs_nested); },
       {},
       {}},
  };

  out << "remat demo: " << o.layers << " residual layers (LayerNorm, Linear " << o.channels << "->" << 4 * o.channels
      << ", GELU, Linear, dropout " << o.dropout << "), input " << o.batch << "x" << o.tokens << "x" << o.channels
      << " fp32, " << threads << ", " << o.steps << " measured steps per strategy after one warm-up, interleaved\n";
  const at::Tensor input = x.clone().requires_grad_(true);
  measure_strategies(strategies, stack, input, o.steps);
  print_strategies(strategies, o.steps, flags.json, out);
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto flags = std::make_shared<DemoFlags>();
  CLI::App* demo = app.add_subcommand("demo", "Show the memory checkpointing saves on a stack of residual layers");
  flags->model.add_to(*demo, ModelUse::stack);
  auto& o = flags->model.options;
  add_measure_steps_option(*demo, flags->measure_steps,
                           "Measured rounds after one warm-up (each strategy one step per round)");
  add_json_flag(*demo, flags->json);
  demo->callback([flags] { run_demo(*flags); });
}

}  // namespace remat::cli
