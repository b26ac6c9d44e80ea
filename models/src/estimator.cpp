#include "remat/models/estimator.h"

#include <algorithm>

#include "remat/error.h"

namespace remat::models {

int64_t element_bytes(const std::string& dtype) {
  if (dtype == "fp32") return 4;
  if (dtype == "bf16" || dtype == "fp16") return 2;
  REMAT_CHECK(false, "unknown dtype '", dtype, "'; use fp32, bf16 or fp16.");
  return 4;
}

GptChainShape::GptChainShape(int64_t layers, const std::string& granularity)
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

}  // namespace

GptEstimate estimate_gpt(const GptConfig& c, const EstimateOptions& o) {
  c.validate();
  REMAT_CHECK(o.batch >= 1, "estimate: batch must be at least 1.");
  const int64_t e = element_bytes(o.dtype);
  const int64_t b = o.batch, s = c.sequence, h = c.hidden, a = c.heads, T = b * s, V = c.vocabulary;
  const bool dropout = c.dropout > 0;
  const int64_t mask = o.dropout_mask_bytes > 0 ? o.dropout_mask_bytes : e;
  const int64_t stats = 2 * T * 4;  // LayerNorm mean and rstd, fp32
  const int64_t maps = a * s * s * b;  // elements of one attention map (B,NH,T,T)

  GptEstimate est;
  // What the fused option keeps instead of an op's `bytes` (the same unless given).
  auto op = [&](const std::string& half, const std::string& what, int64_t bytes, double flops = 0,
                int64_t fused_bytes = -1) {
    est.block_ops.push_back({half, what, bytes, flops, fused_bytes >= 0 ? fused_bytes : bytes});
  };
  const int64_t lse = a * s * b * e;  // one log-sum-exp per query row, in the activation dtype
  op("attention", "LayerNorm 1 mean, rstd (fp32)", stats);
  op("attention", "QKV matmul input: LayerNorm 1 output", T * h * e, 2.0 * T * h * 3 * h);
  op("attention", "QK^T inputs: q, k", 2 * T * h * e, 2.0 * b * s * s * h);
  op("attention", "softmax output", maps * e, 0, 0);
  op("attention", "fused attention: log-sum-exp per query row", 0, 0, lse);
  if (dropout) {
    op("attention", "attention dropout mask", maps * mask, 0, 0);
    op("attention", "P·V input: dropped-out probabilities", maps * e, 0, 0);
  }
  op("attention", "P·V input: v", T * h * e, 2.0 * b * s * s * h);
  op("attention", "output projection input", T * h * e, 2.0 * T * h * h);
  if (dropout) op("attention", "residual dropout mask", T * h * mask, 0, 0);
  op("attention", "attention half output (LayerNorm 2 input)", T * h * e);
  op("mlp", "LayerNorm 2 mean, rstd (fp32)", stats);
  op("mlp", "fc1 input: LayerNorm 2 output", T * h * e, 2.0 * T * h * 4 * h);
  op("mlp", "GELU input: fc1 output", 4 * T * h * e);
  op("mlp", "fc2 input: GELU output", 4 * T * h * e, 2.0 * T * 4 * h * h);
  if (dropout) op("mlp", "residual dropout mask", T * h * mask, 0, 0);
  op("mlp", "MLP half output (next block's input)", T * h * e);
  for (const auto& x : est.block_ops) {
    est.block_bytes += x.kept_bytes;
    est.fused_block_bytes += x.fused_kept_bytes;
    est.block_forward_flops += x.forward_flops;
  }
  est.published_linear_bytes = s * b * h * 34;
  est.published_attention_bytes = 5 * a * s * s * b;
  est.published_block_bytes = est.published_linear_bytes + est.published_attention_bytes;

  // Per half and option: kept bytes, transients (rough: the largest temporaries), FLOPs.
  auto sum_half = [&](const std::string& half) {
    HalfEstimate he;
    for (const auto& x : est.block_ops) {
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
      he.nograd_extra = 4 * T * h * e;  // the fc1 output while GELU runs
      he.backward_extra = 8 * T * h * e;  // gradients of the two 4h-wide tensors
    }
    return he;
  };
  const HalfEstimate attention = sum_half("attention"), mlp = sum_half("mlp");
  const int64_t attention_core = maps * e + (dropout ? maps * (mask + e) : 0) + 2 * T * h * e + T * h * e;  // q,k,P,...,v
  const double attention_core_flops = 4.0 * b * s * s * h;
  auto seconds = [&](double flops) { return flops / o.flops_per_second; };
  auto option_costs = [&](const HalfEstimate& he, bool is_attention) {
    std::vector<StageOptionCost> options;
    options.push_back({"full", seconds(he.forward_flops), seconds(he.backward_flops), he.kept, he.forward_extra,
                       he.backward_extra});
    if (is_attention) {
      // selective keeps the QKV output (3·T·h) instead of q, k, the maps and v; recomputes the core.
      options.push_back({"selective", seconds(he.forward_flops), seconds(he.backward_flops + attention_core_flops),
                         he.kept - attention_core + 3 * T * h * e, he.forward_extra, he.backward_extra + attention_core});
      options.push_back({"matmul-inputs", seconds(he.forward_flops), seconds(he.backward_flops), he.kept - T * h * e,
                         he.forward_extra, he.backward_extra + T * h * e});
    } else {
      options.push_back({"matmul-inputs", seconds(he.forward_flops), seconds(he.backward_flops),
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
    options.push_back({"fused", seconds(fused_forward), seconds(fused_backward), he.fused_kept, fused_forward_extra,
                       fused_backward_extra});
    options.push_back({"fused+matmul-inputs", seconds(fused_forward), seconds(fused_backward), he.fused_kept - inputs,
                       fused_forward_extra + (is_attention ? 0 : 4 * T * h * e), fused_backward_extra + inputs});
    // Graph-only, ending a recomputed segment: the final projection's matmul (proj, fc2) is
    // skipped and the half's output never materialised (not with the MLP's fused matmul-inputs).
    const double tail_flops = is_attention ? 2.0 * T * h * h : 2.0 * T * 4 * h * h;
    for (auto& option : options) {
      if (!is_attention && option.option.find("matmul-inputs") != std::string::npos) continue;
      StageRunCost graph_only = option;
      graph_only.forward_seconds = std::max(0.0, option.forward_seconds - seconds(tail_flops));
      graph_only.kept_bytes = option.kept_bytes - T * h * e;
      option.graph_only = graph_only;
    }
    return options;
  };

  CostTable& table = est.costs;
  table.granularity = o.granularity;
  table.source = "estimated: " + o.dtype + ", batch " + std::to_string(b) + ", " +
                 std::to_string(static_cast<int64_t>(o.flops_per_second / 1e9)) + " GFLOP/s";
  const int64_t boundary = T * h * e;
  // Parameter gradients in the activation dtype (weights and biases; LayerNorm affine).
  const int64_t attention_parameters = (3 * h * h + 3 * h + h * h + h + 2 * h) * e;
  const int64_t mlp_parameters = (4 * h * h + 4 * h + 4 * h * h + h + 2 * h) * e;
  StageCost embed{"embed", boundary, 0, 0, seconds(0), 0, {{"full", 0, 0, boundary + (dropout ? T * h * mask : 0), 0, 0}}};
  embed.parameter_bytes = (V + s) * h * e;
  table.stages.push_back(embed);
  for (int64_t layer = 0; layer < c.layers; ++layer) {
    const std::string n = std::to_string(layer);
    if (o.granularity == "block") {
      StageCost block{"block" + n, boundary, boundary, attention_parameters + mlp_parameters,
                      seconds(attention.forward_flops + mlp.forward_flops), std::max(attention.nograd_extra, mlp.nograd_extra), {}};
      const auto attention_options = option_costs(attention, true);
      const auto mlp_options = option_costs(mlp, false);
      for (const auto& ao : attention_options) {
        // A block option applies to both halves; the MLP has no selective variant (full instead).
        auto mo = mlp_options.front();
        for (const auto& o : mlp_options) {
          if (o.option == ao.option) mo = o;
        }
        block.options.push_back({ao.option, ao.forward_seconds + mo.forward_seconds,
                                 ao.backward_seconds + mo.backward_seconds, ao.kept_bytes + mo.kept_bytes,
                                 std::max<int64_t>(0, std::max(ao.forward_extra_bytes - mo.kept_bytes,
                                                                mo.forward_extra_bytes)),
                                 std::max(mo.backward_extra_bytes, ao.backward_extra_bytes)});
        if (mo.graph_only) {  // the block ends with its MLP half
          StageRunCost graph_only = block.options.back();
          graph_only.forward_seconds = ao.forward_seconds + mo.graph_only->forward_seconds;
          graph_only.kept_bytes = ao.kept_bytes + mo.graph_only->kept_bytes;
          block.options.back().graph_only = graph_only;
        }
      }
      table.stages.push_back(block);
    } else {
      table.stages.push_back({"attn" + n, boundary, boundary, attention_parameters, seconds(attention.forward_flops),
                              attention.nograd_extra, option_costs(attention, true)});
      table.stages.push_back({"mlp" + n, boundary, boundary, mlp_parameters, seconds(mlp.forward_flops), mlp.nograd_extra,
                              option_costs(mlp, false)});
    }
  }
  const double head_flops = 2.0 * T * h * V;
  const int64_t head_kept = stats + T * h * e + T * V * 4 + 4;  // LN, logits' log-softmax (fp32), loss
  table.stages.push_back({"head", 4, boundary, (2 * h + h * V) * e, seconds(head_flops), T * V * e,
                          {{"full", seconds(head_flops), seconds(2 * head_flops), head_kept, T * V * e, T * V * 4}}});
  return est;
}

}  // namespace remat::models
