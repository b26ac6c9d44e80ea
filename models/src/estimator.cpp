#include "remat/models/estimator.h"

#include <algorithm>

#include "remat/base/error.h"

namespace remat::models {

int64_t element_bytes(const std::string& dtype) {
  if (dtype == "fp32") return 4;
  if (dtype == "bf16" || dtype == "fp16") return 2;
  REMAT_CHECK(false, "unknown dtype '", dtype, "'; use fp32, bf16 or fp16.");
  return 4;
}

GptChainShape::GptChainShape(int64_t layers, GptGranularity granularity)
    : granularity_(granularity), stages_(gpt_stages(layers, granularity)) {}

at::Tensor GptChainShape::forward_stage(int64_t, const at::Tensor&, const std::string&) {
  REMAT_CHECK(false, "GptChainShape describes a chain for planning only; it cannot run.");
  return {};
}

namespace {

struct HalfEstimate {
  int64_t kept = 0, fused_kept = 0, forward_extra = 0, backward_extra = 0, nograd_extra = 0;
  double forward_flops = 0, backward_flops = 0;
};

// The sizes every count is made of: e bytes per element, batch b, sequence s, hidden h, heads a,
// T = b·s tokens, vocabulary V.
struct GptSizes {
  int64_t e = 0, b = 0, s = 0, h = 0, a = 0, T = 0, V = 0;
  bool dropout = false;
  bool sac_option = true;  // price the generic option sac (EstimateOptions::sac_option)
  int64_t mask = 0;        // bytes per dropout-mask element
  int64_t stats = 0;       // bytes of one LayerNorm's mean and rstd
  int64_t maps = 0;        // elements of one attention map (B,NH,T,T)
  double flops_per_second = 0;

  double seconds(double flops) const { return flops / flops_per_second; }
};

GptSizes gpt_sizes(const GptConfig& c, const EstimateOptions& o) {
  GptSizes z;
  z.e = element_bytes(o.dtype);
  z.b = o.batch;
  z.s = c.sequence();
  z.h = c.hidden();
  z.a = c.heads();
  z.T = z.b * z.s;
  z.V = c.vocabulary();
  z.dropout = c.dropout() > 0;
  z.sac_option = o.sac_option;
  z.mask = o.dropout_mask_bytes > 0 ? o.dropout_mask_bytes : z.e;
  z.stats = 2 * z.T * 4;  // LayerNorm mean and rstd, fp32
  z.maps = z.a * z.s * z.s * z.b;
  z.flops_per_second = o.flops_per_second;
  return z;
}

std::vector<OpEstimate> block_kept_ops(const GptSizes& z) {
  const int64_t e = z.e, b = z.b, s = z.s, h = z.h, T = z.T, mask = z.mask, stats = z.stats, maps = z.maps;
  std::vector<OpEstimate> ops;
  // What the fused option keeps instead of an op's `bytes` (the same unless given).
  auto op = [&](const std::string& half, const std::string& what, int64_t bytes, double flops = 0,
                int64_t fused_bytes = -1) {
    ops.push_back({half, what, bytes, flops, fused_bytes >= 0 ? fused_bytes : bytes});
  };
  const int64_t lse = z.a * s * b * e;  // one log-sum-exp per query row, in the activation dtype
  op("attention", "LayerNorm 1 mean, rstd (fp32)", stats);
  op("attention", "QKV matmul input: LayerNorm 1 output", T * h * e, 2.0 * T * h * 3 * h);
  op("attention", "QK^T inputs: q, k", 2 * T * h * e, 2.0 * b * s * s * h);
  op("attention", "softmax output", maps * e, 0, 0);
  op("attention", "fused attention: log-sum-exp per query row", 0, 0, lse);
  if (z.dropout) {
    op("attention", "attention dropout mask", maps * mask, 0, 0);
    op("attention", "P·V input: dropped-out probabilities", maps * e, 0, 0);
  }
  op("attention", "P·V input: v", T * h * e, 2.0 * b * s * s * h);
  op("attention", "output projection input", T * h * e, 2.0 * T * h * h);
  if (z.dropout) op("attention", "residual dropout mask", T * h * mask, 0, 0);
  op("attention", "attention half output (LayerNorm 2 input)", T * h * e);
  op("mlp", "LayerNorm 2 mean, rstd (fp32)", stats);
  op("mlp", "fc1 input: LayerNorm 2 output", T * h * e, 2.0 * T * h * 4 * h);
  op("mlp", "GELU input: fc1 output", 4 * T * h * e);
  op("mlp", "fc2 input: GELU output", 4 * T * h * e, 2.0 * T * 4 * h * h);
  if (z.dropout) op("mlp", "residual dropout mask", T * h * mask, 0, 0);
  op("mlp", "MLP half output (next block's input)", T * h * e);
  return ops;
}

void add_block_totals(GptEstimate& est, const GptSizes& z) {
  for (const auto& x : est.block_ops) {
    est.block_bytes += x.kept_bytes;
    est.fused_block_bytes += x.fused_kept_bytes;
    est.block_forward_flops += x.forward_flops;
  }
  est.published_linear_bytes = z.s * z.b * z.h * 34;
  est.published_attention_bytes = 5 * z.a * z.s * z.s * z.b;
  est.published_block_bytes = est.published_linear_bytes + est.published_attention_bytes;
}

// Per half and option: kept bytes, transients (rough: the largest temporaries), FLOPs.
HalfEstimate sum_half(const std::vector<OpEstimate>& ops, const std::string& half, const GptSizes& z) {
  const int64_t e = z.e, h = z.h, T = z.T, maps = z.maps;
  HalfEstimate he;
  for (const auto& x : ops) {
    if (x.half != half) continue;
    he.kept += x.kept_bytes;
    he.fused_kept += x.fused_kept_bytes;
    he.forward_flops += x.forward_flops;
  }
  he.backward_flops = 2 * he.forward_flops;
  if (half == "attention") {
    he.forward_extra = 2 * maps * e + 3 * T * h * e;  // scores and masked scores; the QKV output
    he.nograd_extra = he.forward_extra;
    he.backward_extra = 2 * maps * e + 3 * T * h * e;  // gradients of the maps; of QKV
  } else {
    he.forward_extra = 0;
    he.nograd_extra = 4 * T * h * e;    // the fc1 output while GELU runs
    he.backward_extra = 8 * T * h * e;  // gradients of the two 4h-wide tensors
  }
  return he;
}

// Graph-only, ending a recomputed segment: the final projection's matmul (proj, fc2) is
// skipped and the half's output never materialised (not with the MLP's fused matmul-inputs).
void add_graph_only_costs(std::vector<StageOptionCost>& options, bool is_attention, const GptSizes& z) {
  const int64_t e = z.e, h = z.h, T = z.T;
  const double tail_flops = is_attention ? 2.0 * T * h * h : 2.0 * T * 4 * h * h;
  for (auto& option : options) {
    if (!is_attention && recomputes_matmul_inputs(parse_keep(option.option))) continue;
    StageRunCost graph_only = option;
    graph_only.forward_seconds = std::max(0.0, option.forward_seconds - z.seconds(tail_flops));
    graph_only.kept_bytes = option.kept_bytes - T * h * e;
    option.graph_only = graph_only;
  }
}

// The generic option sac (kSacOption) of a stage whose default option costs `plain`: it
// keeps `kept` (the outputs of its matrix products and its own output) instead of what `plain`
// keeps; its backward first recomputes everything else the plain option would have kept (held
// through its backward, beside the transients), at `recompute_flops` of elementwise work (norms,
// activations, softmax, masks, dropout: a few operations per element). Its recording forward is
// the plain one; its transients are counted as the plain option's peak above what sac keeps (the
// intermediates it does not keep are freed as it goes: an upper bound). No graph-only costs: the
// plain values stand in, an overestimate, as for older profiles.
StageOptionCost sac_option(const StageRunCost& plain, int64_t kept, double recompute_flops, const GptSizes& z) {
  const int64_t dropped = std::max<int64_t>(0, plain.kept_bytes - kept);
  return {kSacOption,
          plain.forward_seconds,
          plain.backward_seconds + z.seconds(recompute_flops),
          std::min(kept, plain.kept_bytes),
          plain.forward_extra_bytes + dropped,
          plain.backward_extra_bytes + dropped};
}

// Elementwise work per element, in FLOP-equivalents: LayerNorm, GELU (erf), softmax with its scale
// and mask, dropout (a draw and a multiply). Rough; they are small beside the matrix products.
constexpr double kLayerNormFlops = 8, kGeluFlops = 20, kSoftmaxFlops = 10, kDropoutFlops = 3;

std::vector<StageOptionCost> half_option_costs(const HalfEstimate& he, bool is_attention, const GptSizes& z) {
  const int64_t e = z.e, b = z.b, s = z.s, h = z.h, T = z.T, maps = z.maps;
  auto seconds = [&](double flops) { return z.seconds(flops); };
  std::vector<StageOptionCost> options;
  options.push_back({to_string(Keep::full), seconds(he.forward_flops), seconds(he.backward_flops), he.kept,
                     he.forward_extra, he.backward_extra});
  if (is_attention) {
    const int64_t attention_core =
        maps * e + (z.dropout ? maps * (z.mask + e) : 0) + 2 * T * h * e + T * h * e;  // q,k,P,...,v
    const double attention_core_flops = 4.0 * b * s * s * h;
    // core-attn keeps the QKV output (3·T·h) instead of q, k, the maps and v; recomputes the core.
    options.push_back({to_string(Keep::core_attn), seconds(he.forward_flops),
                       seconds(he.backward_flops + attention_core_flops), he.kept - attention_core + 3 * T * h * e,
                       he.forward_extra, he.backward_extra + attention_core});
    options.push_back({to_string(Keep::matmul_inputs), seconds(he.forward_flops), seconds(he.backward_flops),
                       he.kept - T * h * e, he.forward_extra, he.backward_extra + T * h * e});
  } else {
    options.push_back({to_string(Keep::matmul_inputs), seconds(he.forward_flops), seconds(he.backward_flops),
                       he.kept - 5 * T * h * e, he.forward_extra + 4 * T * h * e, he.backward_extra + 5 * T * h * e});
  }
  // fused: no map or mask kept. Attention: causal blocks skip the products above the diagonal
  // (half of QK^T and P·V), backward recomputes QK^T once more; its transients are copies of q, k,
  // v, their gradients and a few score blocks of about 2 MiB, not maps.
  const int64_t score_blocks = 4 * std::min<int64_t>(maps, int64_t{1} << 19) * e;
  const double fused_forward = is_attention ? he.forward_flops - 2.0 * b * s * s * h : he.forward_flops;
  const double fused_backward = is_attention ? 2 * fused_forward + 1.0 * b * s * s * h : he.backward_flops;
  const int64_t fused_forward_extra = is_attention ? 3 * T * h * e + score_blocks : he.forward_extra;
  const int64_t fused_backward_extra = is_attention ? 8 * T * h * e + score_blocks : he.backward_extra;
  const int64_t inputs = is_attention ? T * h * e : 5 * T * h * e;  // what matmul-inputs drops
  options.push_back({to_string(Keep::fused), seconds(fused_forward), seconds(fused_backward), he.fused_kept,
                     fused_forward_extra, fused_backward_extra});
  options.push_back({to_string(Keep::fused_matmul_inputs), seconds(fused_forward), seconds(fused_backward),
                     he.fused_kept - inputs, fused_forward_extra + (is_attention ? 0 : 4 * T * h * e),
                     fused_backward_extra + inputs});
  add_graph_only_costs(options, is_attention, z);
  if (z.sac_option) {
    // Kept under save_compute_intensive(): attention: the QKV output (3·T·h), QK^T (a map), P·V and
    // the projection (T·h each), the half's output; MLP: fc1 (4·T·h), fc2 (T·h), the output.
    const double th = static_cast<double>(T * h), map = static_cast<double>(maps);
    const double drop = z.dropout ? kDropoutFlops : 0.0;
    const int64_t kept = is_attention ? 6 * T * h * e + maps * e : 6 * T * h * e;
    const double recompute = is_attention ? kLayerNormFlops * th + (kSoftmaxFlops + drop) * map + (1 + drop) * th
                                          : kLayerNormFlops * th + kGeluFlops * 4 * th + drop * th;
    options.push_back(sac_option(options.front(), kept, recompute, z));
  }
  return options;
}

// Parameter gradients in the activation dtype (weights and biases; LayerNorm affine).
int64_t attention_parameter_bytes(const GptSizes& z) {
  const int64_t h = z.h;
  return (3 * h * h + 3 * h + h * h + h + 2 * h) * z.e;
}

int64_t mlp_parameter_bytes(const GptSizes& z) {
  const int64_t h = z.h;
  return (4 * h * h + 4 * h + 4 * h * h + h + 2 * h) * z.e;
}

StageCost embed_stage(const GptSizes& z) {
  const int64_t boundary = z.T * z.h * z.e;
  StageCost embed{"embed",
                  boundary,
                  0,
                  0,
                  z.seconds(0),
                  0,
                  {{to_string(Keep::full), 0, 0, boundary + (z.dropout ? z.T * z.h * z.mask : 0), 0, 0}}};
  embed.parameter_bytes = (z.V + z.s) * z.h * z.e;
  if (z.sac_option) {  // no matrix product: only its output kept; the gather, add, dropout recomputed
    const double th = static_cast<double>(z.T * z.h);
    embed.options.push_back(sac_option(embed.options.front(), boundary, (1 + (z.dropout ? kDropoutFlops : 0)) * th, z));
  }
  return embed;
}

StageCost block_stage(const std::string& n, const HalfEstimate& attention, const HalfEstimate& mlp, const GptSizes& z) {
  const int64_t boundary = z.T * z.h * z.e;
  StageCost block{"block" + n,
                  boundary,
                  boundary,
                  attention_parameter_bytes(z) + mlp_parameter_bytes(z),
                  z.seconds(attention.forward_flops + mlp.forward_flops),
                  std::max(attention.nograd_extra, mlp.nograd_extra),
                  {}};
  const auto attention_options = half_option_costs(attention, true, z);
  const auto mlp_options = half_option_costs(mlp, false, z);
  for (const auto& ao : attention_options) {
    // A block option applies to both halves; the MLP has no core-attn variant (full instead).
    auto mo = mlp_options.front();
    for (const auto& o : mlp_options) {
      if (o.option == ao.option) mo = o;
    }
    block.options.push_back(
        {ao.option, ao.forward_seconds + mo.forward_seconds, ao.backward_seconds + mo.backward_seconds,
         ao.kept_bytes + mo.kept_bytes,
         std::max<int64_t>(0, std::max(ao.forward_extra_bytes - mo.kept_bytes, mo.forward_extra_bytes)),
         std::max(mo.backward_extra_bytes, ao.backward_extra_bytes)});
    if (mo.graph_only) {  // the block ends with its MLP half
      StageRunCost graph_only = block.options.back();
      graph_only.forward_seconds = ao.forward_seconds + mo.graph_only->forward_seconds;
      graph_only.kept_bytes = ao.kept_bytes + mo.graph_only->kept_bytes;
      block.options.back().graph_only = graph_only;
    }
  }
  return block;
}

void add_half_stages(CostTable& table, const std::string& n, const HalfEstimate& attention, const HalfEstimate& mlp,
                     const GptSizes& z) {
  const int64_t boundary = z.T * z.h * z.e;
  table.stages.push_back({"attn" + n, boundary, boundary, attention_parameter_bytes(z),
                          z.seconds(attention.forward_flops), attention.nograd_extra,
                          half_option_costs(attention, true, z)});
  table.stages.push_back({"mlp" + n, boundary, boundary, mlp_parameter_bytes(z), z.seconds(mlp.forward_flops),
                          mlp.nograd_extra, half_option_costs(mlp, false, z)});
}

StageCost head_stage(const GptSizes& z) {
  const int64_t e = z.e, h = z.h, T = z.T, V = z.V;
  const int64_t boundary = T * h * e;
  const double head_flops = 2.0 * T * h * V;
  const int64_t head_kept = z.stats + T * h * e + T * V * 4 + 4;  // LN, logits' log-softmax (fp32), loss
  StageCost head{
      "head",
      4,
      boundary,
      (2 * h + h * V) * e,
      z.seconds(head_flops),
      T * V * e,
      {{to_string(Keep::full), z.seconds(head_flops), z.seconds(2 * head_flops), head_kept, T * V * e, T * V * 4}}};
  if (z.sac_option) {  // the logits (the head's matrix product) and the loss kept; LN, log-softmax recomputed
    const double recompute = kLayerNormFlops * static_cast<double>(T * h) + kSoftmaxFlops * static_cast<double>(T * V);
    head.options.push_back(sac_option(head.options.front(), T * V * e + 4, recompute, z));
  }
  return head;
}

CostTable gpt_cost_table(const GptConfig& c, const EstimateOptions& o, const std::vector<OpEstimate>& block_ops,
                         const GptSizes& z) {
  const HalfEstimate attention = sum_half(block_ops, "attention", z), mlp = sum_half(block_ops, "mlp", z);
  CostTable table;
  table.granularity = to_string(o.granularity);
  table.source = "estimated: " + o.dtype + ", batch " + std::to_string(z.b) + ", " +
                 std::to_string(static_cast<int64_t>(o.flops_per_second / 1e9)) + " GFLOP/s";
  table.stages.push_back(embed_stage(z));
  for (int64_t layer = 0; layer < c.layers(); ++layer) {
    const std::string n = std::to_string(layer);
    if (o.granularity == GptGranularity::block) {
      table.stages.push_back(block_stage(n, attention, mlp, z));
    } else {
      add_half_stages(table, n, attention, mlp, z);
    }
  }
  table.stages.push_back(head_stage(z));
  const GptChainShape shape(c.layers(), o.granularity);  // the chain's blocks, for Revolve and Chen
  for (size_t i = 0; i < table.stages.size(); ++i) table.stages[i].block = shape.stages()[i].block;
  return table;
}

}  // namespace

GptEstimate estimate_gpt(const GptConfig& c, const EstimateOptions& o) {
  c.validate();
  REMAT_CHECK(o.batch >= 1, "estimate: batch must be at least 1.");
  const GptSizes z = gpt_sizes(c, o);
  GptEstimate est;
  est.block_ops = block_kept_ops(z);
  add_block_totals(est, z);
  est.costs = gpt_cost_table(c, o, est.block_ops, z);
  return est;
}

}  // namespace remat::models
