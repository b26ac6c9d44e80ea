// `remat estimate`: activation memory and FLOPs of GPT configurations too big to run here
// (7B- and 13B-class presets), per operation, per layer against the published formula, and per
// policy.
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "model_flags.h"
#include "planning.h"
#include "remat/base/error.h"
#include "remat/models/estimator.h"
#include "remat/internal/table.h"

namespace remat::cli {
namespace {

struct EstimateFlags {
  ModelFlags model;
  models::EstimateOptions options;
  double tflops = 0.1;  ///< TFLOP/s
  bool json = false;
};

std::string gib(int64_t bytes) { return fixed(mebibytes(bytes) / 1024, 2); }

void run_estimate(EstimateFlags& flags) {
  flags.model.apply_preset();
  struct {
    models::GptConfig model;
    models::EstimateOptions options;
  } f{flags.model.options.model, flags.options};
  f.options.batch = flags.model.options.batch;
  f.options.dtype = flags.model.dtype;
  f.options.flops_per_second = flags.tflops * 1e12;
  REMAT_CHECK(flags.tflops > 0, "--tflops must be positive (TFLOP/s), got ", flags.tflops, ".");
  f.model.validate();
  std::ostream& out = human_output(flags.json);
  models::EstimateOptions half_options = f.options;
  half_options.granularity = models::GptGranularity::half;
  const models::GptEstimate est = models::estimate_gpt(f.model, half_options);
  const ModelCosts costs{est.costs};

  const int64_t s = f.model.sequence(), b = f.options.batch, h = f.model.hidden(), a = f.model.heads();
  out << "remat estimate: GPT " << f.model.describe() << ", batch " << b << ", " << f.options.dtype
      << " activations, dropout masks of "
      << (f.options.dropout_mask_bytes > 0 ? f.options.dropout_mask_bytes : models::element_bytes(f.options.dtype))
      << " byte(s)\n\none block, what each operation keeps for backward under options full and fused:\n";
  Table ops({"half", "kept tensor", "MiB full", "MiB fused", "GFLOP forward"});
  for (const auto& op : est.block_ops) {
    ops.add_row({op.half, op.what, fixed(mebibytes(op.kept_bytes), 2), fixed(mebibytes(op.fused_kept_bytes), 2),
                 fixed(op.forward_flops / 1e9, 2)});
  }
  ops.add_row({"total", "per layer", fixed(mebibytes(est.block_bytes), 2), fixed(mebibytes(est.fused_block_bytes), 2),
               fixed(est.block_forward_flops / 1e9, 2)});
  ops.print(out);
  const double difference =
      static_cast<double>(est.block_bytes - est.published_block_bytes) / static_cast<double>(est.published_block_bytes);
  out << "\npublished per-layer figure s*b*h*(34 + 5*a*s/h) (16-bit, 1-byte masks; Korthikanti et al. 2022): "
      << fixed(mebibytes(est.published_block_bytes), 2) << " MiB; this estimate differs by "
      << (difference >= 0 ? "+" : "") << fixed(100 * difference, 3) << "%"
      << (f.options.dtype == "fp32" ? " (the published figure assumes 16-bit activations)" : "")
      << ".\nDifferences: LayerNorm keeps its mean and rstd (2 fp32 per token, 16*s*b bytes per layer), which the "
         "formula omits; the formula counts each block's input where this counts its output (same per layer).\n";
  out << "Its two terms: s*b*h*34 = " << fixed(mebibytes(est.published_linear_bytes), 2)
      << " MiB and 5*a*s^2*b = " << fixed(mebibytes(est.published_attention_bytes), 2)
      << " MiB (the attention maps). Option fused keeps " << fixed(mebibytes(est.fused_block_bytes), 2)
      << " MiB per layer: no attention map, no dropout mask, so the "
      << "second term is gone (a log-sum-exp per query row, a*s*b elements, remains).\n";

  const int64_t unchecked = costs.unchecked_peak_bytes();
  const int64_t least = least_feasible_budget(costs.half);
  out << "\nwhole model, " << f.model.layers() << " layers: activation peak per policy (the simulator on these costs; "
      << "times from FLOPs at " << fixed(f.options.flops_per_second / 1e12, 2) << " TFLOP/s):\n";
  Table policies({"policy", "activation peak GiB", "vs none", "time overhead"});
  policies.add_row({"none", gib(unchecked), "100.0%", "+0.0%"});
  nlohmann::json json_policies = nlohmann::json::array();
  for (const auto& o : models::gpt_compare_planners(costs, Budget::bytes(unchecked))) {
    if (o.planner != PlannerKind::policy) continue;
    policies.add_row(
        {o.name, gib(o.prediction.peak_bytes),
         fixed(100.0 * static_cast<double>(o.prediction.peak_bytes) / static_cast<double>(unchecked), 1) + "%",
         percent(o.predicted_overhead())});
    json_policies.push_back(
        {{"policy", o.name}, {"peak_bytes", o.prediction.peak_bytes}, {"overhead", o.predicted_overhead()}});
  }
  policies.print(out);
  out << "least activation memory any plan needs (optimal planner): " << gib(least) << " GiB\n";
  (void)s, (void)h, (void)a;
  if (flags.json) {
    std::cout << nlohmann::json({{"per_layer_bytes", est.block_bytes},
                                 {"fused_per_layer_bytes", est.fused_block_bytes},
                                 {"published_per_layer_bytes", est.published_block_bytes},
                                 {"published_attention_bytes", est.published_attention_bytes},
                                 {"relative_difference", difference},
                                 {"unchecked_peak_bytes", unchecked},
                                 {"least_feasible_budget_bytes", least},
                                 {"policies", json_policies}})
                     .dump()
              << "\n";
  }
}

}  // namespace

void add_estimate_command(CLI::App& app) {
  auto f = std::make_shared<EstimateFlags>();
  f->model.options.batch = 1;
  CLI::App* cmd = app.add_subcommand("estimate", "Estimate activation memory and FLOPs of a GPT too big to run here");
  f->model.add_to(*cmd, ModelUse::estimate);
  cmd->add_option("--mask-bytes", f->options.dropout_mask_bytes, "Bytes per dropout-mask element (0: the dtype's)")
      ->capture_default_str()
      ->check(CLI::Range(0, 8))
      ->group("Model");
  cmd->add_option("--tflops", f->tflops, "Assumed throughput in TFLOP/s, for times only")
      ->capture_default_str()
      ->group("Machine");
  add_json_flag(*cmd, f->json);
  cmd->callback([f] { run_estimate(*f); });
}

}  // namespace remat::cli
