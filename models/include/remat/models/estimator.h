// Analytic activation memory and FLOPs of the GPT, for configurations too big to run here.
//
// Counts, op by op, the bytes each operation of a block keeps for backward and its FLOPs, sums
// them into a cost table of the same form the profiler measures (so the same simulator and
// planners apply), and compares the per-layer total with Korthikanti et al. (2022):
// s·b·h·(34 + 5·a·s/h) bytes for 16-bit activations with 1-byte dropout masks. Option "fused"
// (remat::ops::attention and regenerated dropout) keeps no attention map and no dropout mask: the
// formula's second term, 5·a·s²·b, is gone.
#pragma once

#include <string>
#include <vector>

#include "remat/chain/chain.h"
#include "remat/planning/cost_model.h"
#include "remat/models/gpt.h"

namespace remat::models {

struct EstimateOptions {
  std::string dtype = "fp32";  ///< fp32, bf16 or fp16: bytes per activation element
  int64_t batch = 1;
  GptGranularity granularity = GptGranularity::block;
  double flops_per_second = 1e11;  ///< turns FLOPs into the cost table's seconds
  /// Bytes per dropout-mask element: 1 as in Megatron's fused kernels; LibTorch 1.13's CPU dropout
  /// keeps a noise tensor of the activation dtype instead (pass 0 to use the element size).
  int64_t dropout_mask_bytes = 1;
  /// Also price the generic stage option "sac" (kSacOption, remat/chain/chain.h) on every
  /// stage, as ProfileOptions::sac_option makes the profiler measure it: the stage's default
  /// run under save_compute_intensive(), keeping the outputs of its matrix products (QKV, QK^T, P·V,
  /// the projections, fc1, fc2, the head) and recomputing its norms, activations, softmax, masks
  /// and dropout in its backward. Plans and policies naming sac (the policy sac) are costed on it.
  bool sac_option = true;

  /// As LibTorch runs the model here: fp32, half blocks, dropout noise of the activation dtype.
  static EstimateOptions as_run_by_libtorch(int64_t batch) {
    EstimateOptions o;
    o.batch = batch;
    o.granularity = GptGranularity::half;
    o.dropout_mask_bytes = 0;
    return o;
  }
};

struct OpEstimate {
  std::string half;        ///< "attention" or "mlp"
  std::string what;        ///< the kept tensor and the operation that keeps it
  int64_t kept_bytes = 0;  ///< under option "full"
  double forward_flops = 0;
  int64_t fused_kept_bytes = 0;  ///< under option "fused": no attention map, no dropout mask
};

struct GptEstimate {
  std::vector<OpEstimate> block_ops;      ///< one block
  int64_t block_bytes = 0;                ///< sum of block_ops, option "full"
  int64_t fused_block_bytes = 0;          ///< sum of block_ops, option "fused"
  int64_t published_block_bytes = 0;      ///< s·b·h·(34 + 5·a·s/h), the 16-bit published figure
  int64_t published_linear_bytes = 0;     ///< its first term, s·b·h·34
  int64_t published_attention_bytes = 0;  ///< its second term, 5·a·s²·b: the attention maps
  double block_forward_flops = 0;
  CostTable costs;  ///< for the whole chain at the chosen granularity
};

int64_t element_bytes(const std::string& dtype);

GptEstimate estimate_gpt(const GptConfig& config, const EstimateOptions& options);

/// The GPT's chain of stages without a model behind it: for planning configurations that are
/// only estimated. forward_stage throws.
class GptChainShape : public Chain {
 public:
  GptChainShape(int64_t layers, GptGranularity granularity);
  const std::vector<StageInfo>& stages() const override { return stages_; }
  std::string granularity() const override { return to_string(granularity_); }
  at::Tensor forward_stage(int64_t index, const at::Tensor& input, const std::string& option) override;

 private:
  GptGranularity granularity_;
  std::vector<StageInfo> stages_;
};

/// The stages of a GPT with `layers` blocks at `granularity`.
std::vector<StageInfo> gpt_stages(int64_t layers, GptGranularity granularity);

}  // namespace remat::models
