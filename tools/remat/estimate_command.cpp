// `remat estimate`: activation memory and FLOPs of GPT configurations too big to run here
// (7B- and 13B-class presets), per operation, per layer against the published formula, and per
// policy.
#include "estimate_command.h"

#include <iostream>

#include <nlohmann/json.hpp>

#include "planning.h"
#include "remat/error.h"
#include "remat/models/estimator.h"
#include "table.h"

namespace remat::cli {
namespace {

struct EstimateFlags {
  models::GptConfig model;
  models::EstimateOptions options;
  std::string preset;
  bool json = false;
  CLI::App* app = nullptr;
};

std::string gib(int64_t bytes) { return fixed(static_cast<double>(bytes) / (1 << 30), 2); }

void run_estimate(EstimateFlags& f) {
  auto set = [&](const char* flag, auto& field, auto value) {
    if (f.app->count(flag) == 0) field = value;
  };
  if (f.preset == "7b" || f.preset == "13b") {
    const bool big = f.preset == "13b";
    set("--layers", f.model.layers, big ? 40 : 32);
    set("--hidden", f.model.hidden, big ? 5120 : 4096);
    set("--heads", f.model.heads, big ? 40 : 32);
    set("--seq", f.model.sequence, 2048);
    set("--vocab", f.model.vocabulary, 32000);
    set("--batch", f.options.batch, 1);
    set("--dtype", f.options.dtype, std::string("bf16"));
  }
  f.model.validate();
  models::EstimateOptions half_options = f.options;
  half_options.granularity = "half";
  const models::GptEstimate est = models::estimate_gpt(f.model, half_options);
  const ModelCosts costs{est.costs};

  const int64_t s = f.model.sequence, b = f.options.batch, h = f.model.hidden, a = f.model.heads;
  std::cout << "remat estimate: GPT " << f.model.describe() << ", batch " << b << ", " << f.options.dtype
            << " activations, dropout masks of " << (f.options.dropout_mask_bytes > 0 ? f.options.dropout_mask_bytes : models::element_bytes(f.options.dtype))
            << " byte(s)\n\none block (option full), what each operation keeps for backward:\n";
  Table ops({"half", "kept tensor", "MiB", "GFLOP forward"});
  for (const auto& op : est.block_ops) {
    ops.add_row({op.half, op.what, fixed(static_cast<double>(op.kept_bytes) / (1 << 20), 2), fixed(op.forward_flops / 1e9, 2)});
  }
  ops.add_row({"total", "per layer", fixed(static_cast<double>(est.block_bytes) / (1 << 20), 2), fixed(est.block_forward_flops / 1e9, 2)});
  ops.print(std::cout);
  const double difference = static_cast<double>(est.block_bytes - est.published_block_bytes) / static_cast<double>(est.published_block_bytes);
  std::cout << "\npublished per-layer figure s*b*h*(34 + 5*a*s/h) (16-bit, 1-byte masks; Korthikanti et al. 2022): "
            << fixed(static_cast<double>(est.published_block_bytes) / (1 << 20), 2) << " MiB; this estimate differs by "
            << (difference >= 0 ? "+" : "") << fixed(100 * difference, 3) << "%"
            << (f.options.dtype == "fp32" ? " (the published figure assumes 16-bit activations)" : "")
            << ".\nDifferences: LayerNorm keeps its mean and rstd (2 fp32 per token, 16*s*b bytes per layer), which the "
               "formula omits; the formula counts each block's input where this counts its output (same per layer).\n";

  const int64_t unchecked = costs.unchecked_peak_bytes();
  const int64_t least =
      least_feasible_budget(costs.half, Plan::plain(models::GptChainShape(f.model.layers, "half")), 1000);
  const double none_seconds = costs.unchecked().step_seconds;
  std::cout << "\nwhole model, " << f.model.layers << " layers: activation peak per policy (the simulator on these costs; "
            << "times from FLOPs at " << fixed(f.options.flops_per_second / 1e12, 2) << " TFLOP/s):\n";
  Table policies({"policy", "activation peak GiB", "vs none", "time overhead"});
  policies.add_row({"none", gib(unchecked), "100.0%", "+0.0%"});
  nlohmann::json json_policies = nlohmann::json::array();
  for (const auto& o : models::gpt_compare_planners(costs, unchecked, 1000)) {
    if (o.name == "revolve" || o.name == "chen" || o.plan.stage_names.empty()) continue;
    policies.add_row({o.name, gib(o.prediction.peak_bytes),
                      fixed(100.0 * static_cast<double>(o.prediction.peak_bytes) / static_cast<double>(unchecked), 1) + "%",
                      "+" + fixed(100.0 * (o.prediction.step_seconds / none_seconds - 1), 1) + "%"});
    json_policies.push_back({{"policy", o.name}, {"peak_bytes", o.prediction.peak_bytes},
                             {"overhead", o.prediction.step_seconds / none_seconds - 1}});
  }
  policies.print(std::cout);
  std::cout << "least activation memory any plan needs (optimal planner): " << gib(least) << " GiB\n";
  (void)s, (void)h, (void)a;
  if (f.json) {
    std::cout << nlohmann::json({{"per_layer_bytes", est.block_bytes}, {"published_per_layer_bytes", est.published_block_bytes},
                                 {"relative_difference", difference}, {"unchecked_peak_bytes", unchecked},
                                 {"min_feasible_budget_bytes", least}, {"policies", json_policies}})
                     .dump()
              << "\n";
  }
}

}  // namespace

void add_estimate_command(CLI::App& app) {
  auto f = std::make_shared<EstimateFlags>();
  CLI::App* cmd = app.add_subcommand("estimate", "Estimate activation memory and FLOPs of a GPT too big to run here");
  f->app = cmd;
  cmd->add_option("--preset", f->preset, "7b or 13b: a LLaMA-like 7B/13B-class config, batch 1, seq 2048, bf16")
      ->check(CLI::IsMember({"7b", "13b"}));
  cmd->add_option("--layers", f->model.layers)->capture_default_str();
  cmd->add_option("--hidden", f->model.hidden)->capture_default_str();
  cmd->add_option("--heads", f->model.heads)->capture_default_str();
  cmd->add_option("--seq", f->model.sequence)->capture_default_str();
  cmd->add_option("--vocab", f->model.vocabulary)->capture_default_str();
  cmd->add_option("--dropout", f->model.dropout)->capture_default_str();
  cmd->add_option("--batch", f->options.batch)->capture_default_str();
  cmd->add_option("--dtype", f->options.dtype, "fp32, bf16 or fp16")->capture_default_str()->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  cmd->add_option("--mask-bytes", f->options.dropout_mask_bytes, "Bytes per dropout-mask element (0: the dtype's)")->capture_default_str();
  cmd->add_option("--tflops", f->options.flops_per_second, "Assumed throughput, FLOP/s (times only)")->capture_default_str();
  cmd->add_flag("--json", f->json, "Also print a JSON summary");
  cmd->callback([f] { run_estimate(*f); });
}

}  // namespace remat::cli
