// A GPT-2-style decoder, and the same model seen as a chain of stages for remat's plans.
//
// Legend for shape comments: B batch, T tokens (sequence), C channels (hidden), NH heads,
// HS head size (C / NH), V vocabulary.
//
//   tokens (B,T) ─ embed: wte + wpe, dropout ─ (B,T,C)
//     N × block: x + drop(proj(attn(ln1 x)))      ← attention half
//                x + drop(fc2(gelu(fc1(ln2 x))))  ← MLP half
//   ─ head: ln_f, linear to V (no bias), cross-entropy ─ loss
//
// Attention computes explicit scores (B,NH,T,T), a causal mask, softmax and attention dropout.
// Stage options (what a stage keeps inside):
//   full           everything its operations save
//   core-attn      Megatron-LM's selective recomputation of the core attention: recompute
//                  softmax(QK^T)·V from q, k, v in backward (once named "selective")
//   matmul-inputs  recompute LayerNorm and GELU outputs (cheap) for the matmuls that consume them
//                  instead of keeping them (fused_ops.h); softmax stays, since its backward needs
//                  its output and recomputing it pays only with P·V recomputed too (core-attn)
//   fused          recompute inside operations: attention by remat::ops::attention (keeps q, k, v,
//                  its output and a log-sum-exp per row, no (B,NH,T,T) tensor) and every dropout of
//                  the stage by remat::ops::dropout (a seed instead of a mask)
//   fused+matmul-inputs   both
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "remat/chain/chain.h"
#include "remat/chain/plan.h"
#include "remat/models/gpt_granularity.h"

namespace remat::models {

/// What a block keeps inside (see the stage options above).
enum class Keep { full, core_attn, matmul_inputs, fused, fused_matmul_inputs };

/// The one table of the GPT's stage options: their names (as plans, cost tables and policies spell
/// them), which halves offer them and what each trades; parsing, the chain's stages, the option
/// policies and the estimator all derive from it.
struct KeepOption {
  Keep keep;
  const char* name;
  bool attention_only;   ///< offered by attention halves only (the MLP half has no attention core)
  const char* tradeoff;  ///< one line, as `remat policies` shows it
};
/// In order; the first (full) is every stage's default.
const std::vector<KeepOption>& keep_options();
/// The table's row of `keep`.
const KeepOption& keep_option(Keep keep);
/// The option's name ("matmul-inputs").
const char* to_string(Keep keep);
/// The option named `option`; a clear error listing the names for any other, and naming the new
/// name of an option renamed ("selective" is "core-attn": "selective" is per-operator checkpointing).
Keep parse_keep(const std::string& option);
/// The names of the options a stage offers: a block or attention half all, an MLP half those not
/// attention-only.
std::vector<std::string> keep_option_names(bool attention);
/// Whether `keep` recomputes LayerNorm and GELU outputs (matmul-inputs, alone or with fused).
bool recomputes_matmul_inputs(Keep keep);
/// Whether `keep` uses remat's fused attention and regenerated dropout.
bool is_fused(Keep keep);

/// GptConfig().layers(12).hidden(768).heads(12): the defaults are the reference workload's.
struct GptConfig {
  /// Transformer blocks.
  TORCH_ARG(int64_t, layers) = 8;
  /// Channels C of the residual stream.
  TORCH_ARG(int64_t, hidden) = 256;
  /// Attention heads NH; must divide hidden.
  TORCH_ARG(int64_t, heads) = 8;
  /// Tokens T per sequence (the positional table's length).
  TORCH_ARG(int64_t, sequence) = 256;
  /// Tokens V of the vocabulary.
  TORCH_ARG(int64_t, vocabulary) = 256;
  /// Dropout probability after the embedding, on attention probabilities and on both residual branches.
  TORCH_ARG(double, dropout) = 0.1;

 public:
  /// Throws a clear error for impossible configurations (heads not dividing hidden, sizes beyond
  /// any machine: more than 100,000 layers, a hidden size, sequence or vocabulary over 2^24, ...).
  void validate() const;
  /// Bytes the model holds (fp32 parameters and each block's causal mask), in double: no overflow.
  double model_bytes() const;
  bool operator==(const GptConfig& other) const;
  /// "layers 8, hidden 256, heads 8, sequence 256, vocabulary 256, dropout 0.1"
  std::string describe() const;
};

/// Refuses, before anything is allocated, a run of `config` this machine cannot hold: the model,
/// its gradients and `optimizer_moments` fp32 copies of its parameters, plus `activation_bytes`.
/// The error names the configuration and how to shrink it.
void check_gpt_run_fits_in_memory(const GptConfig& config, double activation_bytes, int optimizer_moments);

class GptBlockImpl : public torch::nn::Module {
 public:
  GptBlockImpl(const GptConfig& config);

  /// (B,T,C) -> (B,T,C). `graph_only`: the result only roots a recompute's backward
  /// (Chain::forward_stage_graph_only), so the final projection's matmul is skipped.
  at::Tensor attention_half(const at::Tensor& x, Keep keep = Keep::full, bool graph_only = false);
  /// (B,T,C) -> (B,T,C). `graph_only` as above: fc2's matmul is skipped (not with matmul-inputs,
  /// whose fused GELU→fc2 recomputes GELU from fc1's output in backward).
  at::Tensor mlp_half(const at::Tensor& x, Keep keep = Keep::full, bool graph_only = false);

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};

 private:
  at::Tensor core_attention(const at::Tensor& qkv_out, bool fused = false);  // (B,T,3C) -> (B,T,C)
  at::Tensor residual_dropout(const at::Tensor& x, bool fused);
  int64_t heads_;
  double dropout_;
  at::Tensor causal_mask_;  // (T,T) bool, true above the diagonal; not a buffer: not saved
};
TORCH_MODULE(GptBlock);

class GptImpl : public torch::nn::Module {
 public:
  explicit GptImpl(const GptConfig& config);

  at::Tensor embed(const at::Tensor& tokens);                       // (B,T) int64 -> (B,T,C)
  at::Tensor logits(const at::Tensor& x);                           // (B,T,C) -> (B,T,V)
  at::Tensor loss(const at::Tensor& x, const at::Tensor& targets);  // (B,T,C), (B,T) -> scalar
  /// The plain forward: tokens (B,T) and targets (B,T) to the mean cross-entropy.
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& targets);

  const GptConfig& config() const { return config_; }

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  std::vector<GptBlock> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};

 private:
  GptConfig config_;
};
TORCH_MODULE(Gpt);

/// What a stage of the GPT's chain is: embed, block (GptGranularity::block), attention or MLP half
/// (GptGranularity::half), head.
enum class GptStage { embed, block, attention, mlp, head };
GptStage gpt_stage_kind(int64_t index, int64_t stages, GptGranularity granularity);

/// The same plan at half-block granularity: block i becomes attn i, mlp i at the same place (in
/// the same segment); a block option applies to both halves where the half offers it. Plans of both
/// granularities are then costed on one (half-block) cost table.
Plan to_half_granularity(const Plan& plan);

/// The GPT as a chain: embed, then per block either one stage (block) or two (half: attention
/// half, MLP half), then head (which returns the loss against the targets set with
/// `set_targets`). The chain keeps a reference to the model: keep both alive through backward.
class GptChain : public Chain {
 public:
  GptChain(Gpt model, GptGranularity granularity);

  const std::vector<StageInfo>& stages() const override { return stages_; }
  std::string granularity() const override { return to_string(granularity_); }
  GptGranularity gpt_granularity() const { return granularity_; }
  at::Tensor forward_stage(int64_t index, const at::Tensor& input, const std::string& option) override;
  /// Attention, MLP and block stages skip their final projection's matmul (fused_ops.h).
  at::Tensor forward_stage_graph_only(int64_t index, const at::Tensor& input, const std::string& option) override;
  std::vector<at::Tensor> stage_parameters(int64_t index) const override;
  std::vector<std::string> stage_parameter_names(int64_t index) const override;
  /// Blocks and their halves: the kind and the parameter shapes (all layers are twins).
  std::string stage_signature(int64_t index) const override;

  /// The next-token targets (B,T) the head stage's loss uses.
  void set_targets(const at::Tensor& targets) { targets_ = targets; }
  Gpt model() const { return model_; }

 private:
  Gpt model_;
  GptGranularity granularity_;
  at::Tensor run_with_option(int64_t index, const at::Tensor& input, const std::string& option, bool graph_only);
  /// The modules stage `index` runs, with their names in the model.
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> stage_modules(int64_t index) const;

  std::vector<StageInfo> stages_;
  at::Tensor targets_;
};

/// The GPT's two chains over one model, whole blocks and half-blocks: the one place that picks the
/// chain a plan of either granularity runs on.
struct GptChains {
  explicit GptChains(Gpt model) : block(model, GptGranularity::block), half(std::move(model), GptGranularity::half) {}
  GptChain& of(GptGranularity granularity) { return granularity == GptGranularity::half ? half : block; }
  /// The chain `plan` runs on; a clear error for a plan of another chain's granularity.
  GptChain& of(const Plan& plan) { return of(gpt_granularity_of(plan)); }
  void set_targets(const at::Tensor& targets) {
    block.set_targets(targets);
    half.set_targets(targets);
  }
  GptChain block, half;
};

}  // namespace remat::models
