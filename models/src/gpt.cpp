#include "remat/models/gpt.h"

#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <iomanip>
#include <sstream>

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>

#include "remat/checkpoint/checkpoint.h"
#include "remat/models/estimator.h"
#include "remat/models/fused_ops.h"
#include "remat/base/error.h"
#include "remat/memory/memory.h"
#include "remat/ops/attention.h"
#include "remat/ops/dropout.h"

namespace remat::models {

namespace F = torch::nn::functional;

const std::vector<KeepOption>& keep_options() {
  static const std::vector<KeepOption> table = {
      {Keep::full, "full", false, "everything the block's operations save"},
      {Keep::core_attn, "core-attn", true,
       "Megatron-LM's selective recomputation: recompute only the core attention softmax(QK^T)V; keeps all matmul "
       "inputs, little recompute"},
      {Keep::matmul_inputs, "matmul-inputs", false,
       "recompute LayerNorm and GELU outputs for the matmuls that read them: drops ~6 of ~34 B·T·C per block, cheap"},
      {Keep::fused, "fused", false,
       "recompute inside operations: memory-efficient attention keeps no T^2 tensor, dropout keeps a seed, not a mask"},
      {Keep::fused_matmul_inputs, "fused+matmul-inputs", false,
       "fused and matmul-inputs together: the least a block keeps without checkpointing it"},
  };
  return table;
}

const KeepOption& keep_option(Keep keep) {
  for (const auto& o : keep_options()) {
    if (o.keep == keep) return o;
  }
  return keep_options().front();
}

const char* to_string(Keep keep) { return keep_option(keep).name; }

Keep parse_keep(const std::string& option) {
  REMAT_CHECK(option != "selective",
              "the stage option 'selective' is now called 'core-attn' (Megatron-LM's selective "
              "recomputation of the core attention); 'selective' names per-operator checkpointing, the option 'sac'.");
  std::string names;
  for (const auto& o : keep_options()) {
    if (option == o.name) return o.keep;
    names += (names.empty() ? "" : ", ") + std::string(o.name);
  }
  REMAT_CHECK(false, "unknown stage option '", option.size() > 40 ? option.substr(0, 37) + "..." : option,
              "'; use one of ", names, ".");
  return Keep::full;
}

std::vector<std::string> keep_option_names(bool attention) {
  std::vector<std::string> names;
  for (const auto& o : keep_options()) {
    if (attention || !o.attention_only) names.emplace_back(o.name);
  }
  return names;
}

bool recomputes_matmul_inputs(Keep keep) { return keep == Keep::matmul_inputs || keep == Keep::fused_matmul_inputs; }
bool is_fused(Keep keep) { return keep == Keep::fused || keep == Keep::fused_matmul_inputs; }

void GptConfig::validate() const {
  REMAT_CHECK(layers_ >= 1, field("GptConfig::layers"), " must be at least 1, got ", layers_, ".");
  REMAT_CHECK(hidden_ >= 1 && heads_ >= 1, field("GptConfig::hidden"), " and ", field("GptConfig::heads"),
              " must be positive, got ", hidden_, " and ", heads_, ".");
  REMAT_CHECK(hidden_ % heads_ == 0, field("GptConfig::heads"), " (", heads_, ") must divide ",
              field("GptConfig::hidden"), " (", hidden_, "): each head gets hidden/heads ", "channels; ",
              std::gcd(hidden_, heads_) > 0 ? std::gcd(hidden_, heads_) : 1, " heads would.");
  REMAT_CHECK(sequence_ >= 1, field("GptConfig::sequence"), " must be at least 1, got ", sequence_, ".");
  REMAT_CHECK(vocabulary_ >= 2, "the vocabulary must have at least 2 tokens, got ", vocabulary_, ".");
  REMAT_CHECK(dropout_ >= 0.0 && dropout_ < 1.0, field("GptConfig::dropout"), " must be in [0, 1), got ", dropout_,
              ".");
  // Beyond these no machine holds the model (or its cost table); refused before anything is sized.
  constexpr int64_t kMaxLayers = 100000, kMaxSize = int64_t{1} << 24;
  REMAT_CHECK(layers_ <= kMaxLayers, field("GptConfig::layers"), " must be at most ", kMaxLayers, ", got ", layers_,
              ".");
  REMAT_CHECK(hidden_ <= kMaxSize && heads_ <= hidden_, field("GptConfig::hidden"), " must be at most ", kMaxSize,
              " and ", field("GptConfig::heads"), " at most hidden, got ", hidden_, " and ", heads_, ".");
  REMAT_CHECK(sequence_ <= kMaxSize, field("GptConfig::sequence"), " must be at most ", kMaxSize, ", got ", sequence_,
              ".");
  REMAT_CHECK(vocabulary_ <= kMaxSize, field("GptConfig::vocabulary"), " must be at most ", kMaxSize, ", got ",
              vocabulary_, ".");
}

double GptConfig::model_bytes() const {
  const double h = static_cast<double>(hidden_), v = static_cast<double>(vocabulary_),
               t = static_cast<double>(sequence_);
  const double parameters = static_cast<double>(layers_) * (12.0 * h * h + 13.0 * h) + (v + t) * h + v * h + 2.0 * h;
  return 4.0 * parameters + static_cast<double>(layers_) * t * t;  // fp32, and a bool mask per block
}

void check_gpt_run_fits_in_memory(const GptConfig& config, double activation_bytes, int optimizer_moments) {
  config.validate();
  const double model = config.model_bytes();
  const double held = model * (2.0 + optimizer_moments) + activation_bytes;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  std::ostringstream what;
  what << std::setprecision(3) << "a GPT of " << config.describe() << " (" << model / gib
       << " GiB of parameters, as much again of gradients"
       << (optimizer_moments > 0 ? ", " + std::to_string(optimizer_moments) + " optimizer moments" : std::string())
       << ", " << activation_bytes / gib << " GiB of activations)";
  check_fits_in_machine_memory(held, what.str(),
                               "Use a smaller configuration (layers, hidden, sequence) or batch, a checkpointing "
                               "policy, or a budget.");
}

bool GptConfig::operator==(const GptConfig& o) const {
  return layers_ == o.layers() && hidden_ == o.hidden() && heads_ == o.heads() && sequence_ == o.sequence() &&
         vocabulary_ == o.vocabulary() && dropout_ == o.dropout();
}

std::string GptConfig::describe() const {
  std::ostringstream os;
  os << "layers " << layers_ << ", hidden " << hidden_ << ", heads " << heads_ << ", sequence " << sequence_
     << ", vocabulary " << vocabulary_ << ", dropout " << dropout_;
  return os.str();
}

GptBlockImpl::GptBlockImpl(const GptConfig& c) : heads_(c.heads()), dropout_(c.dropout()) {
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden()})));
  qkv = register_module("qkv", torch::nn::Linear(c.hidden(), 3 * c.hidden()));
  proj = register_module("proj", torch::nn::Linear(c.hidden(), c.hidden()));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden()})));
  fc1 = register_module("fc1", torch::nn::Linear(c.hidden(), 4 * c.hidden()));
  fc2 = register_module("fc2", torch::nn::Linear(4 * c.hidden(), c.hidden()));
  causal_mask_ = torch::ones({c.sequence(), c.sequence()}, torch::kBool).triu(1);
}

at::Tensor GptBlockImpl::core_attention(const at::Tensor& qkv_out, bool fused) {
  const int64_t B = qkv_out.size(0), T = qkv_out.size(1), C = qkv_out.size(2) / 3, HS = C / heads_;
  auto split = qkv_out.split(C, /*dim=*/2);
  at::Tensor q = split[0].view({B, T, heads_, HS}).transpose(1, 2);  // (B,NH,T,HS)
  at::Tensor k = split[1].view({B, T, heads_, HS}).transpose(1, 2);  // (B,NH,T,HS)
  at::Tensor v = split[2].view({B, T, heads_, HS}).transpose(1, 2);  // (B,NH,T,HS)
  if (fused) {
    // A transposed view of a contiguous (B,T,NH,HS) tensor: the reshape is free, and proj keeps
    // the very tensor the attention keeps as its output.
    return ops::attention(q, k, v, ops::AttentionOptions().causal(true).dropout(dropout_).training(is_training()))
        .transpose(1, 2)
        .reshape({B, T, C});
  }
  at::Tensor scores = q.matmul(k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(HS)));  // (B,NH,T,T)
  if (causal_mask_.device() != scores.device()) causal_mask_ = causal_mask_.to(scores.device());
  scores = scores.masked_fill(causal_mask_.slice(0, 0, T).slice(1, 0, T), -std::numeric_limits<float>::infinity());
  at::Tensor probs = scores.softmax(-1);  // (B,NH,T,T)
  probs = F::dropout(probs, F::DropoutFuncOptions().p(dropout_).training(is_training()));
  return probs.matmul(v).transpose(1, 2).contiguous().view({B, T, C});  // (B,T,C)
}

at::Tensor GptBlockImpl::residual_dropout(const at::Tensor& x, bool fused) {
  if (fused) return ops::dropout(x, dropout_, is_training());
  return F::dropout(x, F::DropoutFuncOptions().p(dropout_).training(is_training()));
}

at::Tensor GptBlockImpl::attention_half(const at::Tensor& x, Keep keep, bool graph_only) {
  at::Tensor qkv_out = recomputes_matmul_inputs(keep)  // (B,T,3C)
                           ? layer_norm_linear(x, ln1->weight, ln1->bias, ln1->options.eps(), qkv->weight, qkv->bias)
                           : qkv(ln1(x));
  at::Tensor attended = keep == Keep::core_attn
                            ? checkpoint([this](const at::Tensor& in) { return core_attention(in); }, qkv_out,
                                         CheckpointOptions().name("core attention").use_reentrant(true))
                            : core_attention(qkv_out, is_fused(keep));  // (B,T,C)
  if (graph_only) {
    return residual_linear_dropout_graph_only(x, attended, proj->weight, proj->bias, dropout_, is_training(),
                                              is_fused(keep));
  }
  return x + residual_dropout(proj(attended), is_fused(keep));
}

at::Tensor GptBlockImpl::mlp_half(const at::Tensor& x, Keep keep, bool graph_only) {
  if (graph_only && !recomputes_matmul_inputs(keep)) {
    return residual_linear_dropout_graph_only(x, F::gelu(fc1(ln2(x))), fc2->weight, fc2->bias, dropout_, is_training(),
                                              is_fused(keep));
  }
  at::Tensor out;  // (B,T,C)
  if (recomputes_matmul_inputs(keep)) {
    at::Tensor u =
        layer_norm_linear(x, ln2->weight, ln2->bias, ln2->options.eps(), fc1->weight, fc1->bias);  // (B,T,4C)
    out = gelu_linear(u, fc2->weight, fc2->bias);
  } else {
    out = fc2(F::gelu(fc1(ln2(x))));  // GELU output (B,T,4C) kept for fc2, erf GELU
  }
  return x + residual_dropout(out, is_fused(keep));
}

GptImpl::GptImpl(const GptConfig& config) : config_(config) {
  config.validate();
  check_fits_in_machine_memory(config.model_bytes(), "a GPT of " + config.describe(),
                               "Use a smaller configuration (layers, hidden, sequence, vocabulary).");
  wte = register_module("wte", torch::nn::Embedding(config.vocabulary(), config.hidden()));
  wpe = register_module("wpe", torch::nn::Embedding(config.sequence(), config.hidden()));
  for (int64_t i = 0; i < config.layers(); ++i) {
    blocks.push_back(register_module("block" + std::to_string(i), GptBlock(config)));
  }
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.hidden()})));
  head = register_module("head",
                         torch::nn::Linear(torch::nn::LinearOptions(config.hidden(), config.vocabulary()).bias(false)));

  // GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2·layers).
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    if (name.find("ln") != std::string::npos) continue;
    if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
      p.value().zero_();
      continue;
    }
    const bool residual = name.find("proj.weight") != std::string::npos || name.find("fc2.weight") != std::string::npos;
    torch::nn::init::normal_(p.value(), 0.0, residual ? 0.02 / std::sqrt(2.0 * config.layers()) : 0.02);
  }
}

at::Tensor GptImpl::embed(const at::Tensor& tokens) {
  REMAT_CHECK(tokens.dim() == 2 && tokens.scalar_type() == at::kLong, "the GPT takes int64 tokens of shape (B, T).");
  const int64_t T = tokens.size(1);
  REMAT_CHECK(T <= config_.sequence(), "the GPT was built for sequences of ", config_.sequence(), " tokens, got ", T,
              ".");
  at::Tensor positions = torch::arange(T, tokens.options());  // (T)
  at::Tensor x = wte(tokens) + wpe(positions);                // (B,T,C)
  return F::dropout(x, F::DropoutFuncOptions().p(config_.dropout()).training(is_training()));
}

at::Tensor GptImpl::logits(const at::Tensor& x) { return head(ln_f(x)); }

at::Tensor GptImpl::loss(const at::Tensor& x, const at::Tensor& targets) {
  at::Tensor l = logits(x);  // (B,T,V)
  return F::cross_entropy(l.view({-1, l.size(-1)}), targets.reshape({-1}));
}

at::Tensor GptImpl::forward(const at::Tensor& tokens, const at::Tensor& targets) {
  at::Tensor x = embed(tokens);
  for (auto& block : blocks) x = block->mlp_half(block->attention_half(x));
  return loss(x, targets);
}

GptStage gpt_stage_kind(int64_t index, int64_t stages, GptGranularity granularity) {
  if (index == 0) return GptStage::embed;
  if (index == stages - 1) return GptStage::head;
  if (granularity == GptGranularity::block) return GptStage::block;
  return index % 2 == 1 ? GptStage::attention : GptStage::mlp;
}

std::vector<StageInfo> gpt_stages(int64_t layers, GptGranularity granularity) {
  const std::vector<std::string> block_options = keep_option_names(/*attention=*/true);
  const std::vector<std::string> mlp_options = keep_option_names(/*attention=*/false);
  const std::vector<std::string> plain = {to_string(Keep::full)};  // embed and head have no options
  std::vector<StageInfo> stages;
  stages.push_back({"embed", -1, plain});
  for (int64_t b = 0; b < layers; ++b) {
    const std::string n = std::to_string(b);
    if (granularity == GptGranularity::block) {
      stages.push_back({"block" + n, b, block_options});
    } else {
      stages.push_back({"attn" + n, b, block_options});
      stages.push_back({"mlp" + n, b, mlp_options});
    }
  }
  stages.push_back({"head", -1, plain});
  return stages;
}

Plan to_half_granularity(const Plan& plan) {
  if (gpt_granularity_of(plan) == GptGranularity::half) return plan;
  const int64_t layers = static_cast<int64_t>(plan.stage_names.size()) - 2;
  Plan half;
  half.granularity = to_string(GptGranularity::half);
  half.mode = plan.mode;
  for (const auto& stage : gpt_stages(layers, GptGranularity::half)) half.stage_names.push_back(stage.name);
  half.options.assign(half.stage_names.size(), to_string(Keep::full));
  half.default_options = half.options;
  half.options.front() = plan.options.front();
  half.options.back() = plan.options.back();
  for (int64_t b = 0; b < layers; ++b) {
    const std::string& option = plan.options[b + 1];
    half.options[1 + 2 * b] = option;
    // An option the MLP half does not offer (core-attn) leaves it full; the generic selective
    // option applies to both halves.
    const bool offered = option == kSacOption || !keep_option(parse_keep(option)).attention_only;
    half.options[2 + 2 * b] = offered ? option : to_string(Keep::full);
  }
  // Stage index i of the block chain: 0 embed, 1..layers blocks, layers+1 head.
  std::function<std::vector<PlanItem>(const std::vector<PlanItem>&)> convert = [&](const std::vector<PlanItem>& items) {
    std::vector<PlanItem> out;
    for (const auto& item : items) {
      if (!item.is_stage()) {
        out.push_back(PlanItem::checkpointed(convert(item.segment)));
      } else if (item.stage == 0) {
        out.push_back(PlanItem::run(0));
      } else if (item.stage == layers + 1) {
        out.push_back(PlanItem::run(2 * layers + 1));
      } else {
        out.push_back(PlanItem::run(2 * item.stage - 1));
        out.push_back(PlanItem::run(2 * item.stage));
      }
    }
    return out;
  };
  half.items = convert(plan.items);
  return half;
}

GptChain::GptChain(Gpt model, GptGranularity granularity)
    : model_(std::move(model)),
      granularity_(granularity),
      stages_(gpt_stages(static_cast<int64_t>(model_->blocks.size()), granularity)) {}

std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> GptChain::stage_modules(int64_t index) const {
  const StageInfo& stage = stages_.at(index);
  switch (gpt_stage_kind(index, size(), granularity_)) {
    case GptStage::embed:
      return {{"wte", model_->wte.ptr()}, {"wpe", model_->wpe.ptr()}};
    case GptStage::head:
      return {{"ln_f", model_->ln_f.ptr()}, {"head", model_->head.ptr()}};
    case GptStage::block:
      return {{"block" + std::to_string(stage.block), model_->blocks[stage.block].ptr()}};
    case GptStage::attention: {
      const auto& block = model_->blocks[stage.block];
      const std::string prefix = "block" + std::to_string(stage.block) + ".";
      return {
          {prefix + "ln1", block->ln1.ptr()}, {prefix + "qkv", block->qkv.ptr()}, {prefix + "proj", block->proj.ptr()}};
    }
    case GptStage::mlp: {
      const auto& block = model_->blocks[stage.block];
      const std::string prefix = "block" + std::to_string(stage.block) + ".";
      return {
          {prefix + "ln2", block->ln2.ptr()}, {prefix + "fc1", block->fc1.ptr()}, {prefix + "fc2", block->fc2.ptr()}};
    }
  }
  return {};
}

std::vector<at::Tensor> GptChain::stage_parameters(int64_t index) const {
  std::vector<at::Tensor> parameters;
  for (const auto& [name, module] : stage_modules(index)) {
    for (const auto& p : module->parameters()) parameters.push_back(p);
  }
  return parameters;
}

std::vector<std::string> GptChain::stage_parameter_names(int64_t index) const {
  std::vector<std::string> names;
  for (const auto& [name, module] : stage_modules(index)) {
    for (const auto& p : module->named_parameters()) names.push_back(name + "." + p.key());
  }
  return names;
}

std::string GptChain::stage_signature(int64_t index) const {
  const GptStage kind = gpt_stage_kind(index, size(), granularity_);
  if (kind == GptStage::embed || kind == GptStage::head) return {};  // one of each
  std::ostringstream signature;
  signature << static_cast<int>(kind) << ":";
  for (const auto& p : stage_parameters(index)) signature << p.sizes();
  return signature.str();
}

at::Tensor GptChain::forward_stage(int64_t index, const at::Tensor& input, const std::string& option) {
  return run_with_option(index, input, option, /*graph_only=*/false);
}

at::Tensor GptChain::forward_stage_graph_only(int64_t index, const at::Tensor& input, const std::string& option) {
  return run_with_option(index, input, option, /*graph_only=*/true);
}

at::Tensor GptChain::run_with_option(int64_t index, const at::Tensor& input, const std::string& option,
                                     bool graph_only) {
  const StageInfo& stage = stages_.at(index);
  const Keep keep = parse_keep(option);
  switch (gpt_stage_kind(index, size(), granularity_)) {
    case GptStage::embed:
      return model_->embed(input);
    case GptStage::head:
      REMAT_CHECK(targets_.defined(), "GptChain: set the targets before running the head stage.");
      return model_->loss(input, targets_);
    case GptStage::block: {
      auto& block = model_->blocks[stage.block];
      return block->mlp_half(block->attention_half(input, keep), keep_option(keep).attention_only ? Keep::full : keep,
                             graph_only);
    }
    case GptStage::attention:
      return model_->blocks[stage.block]->attention_half(input, keep, graph_only);
    case GptStage::mlp:
      return model_->blocks[stage.block]->mlp_half(input, keep, graph_only);
  }
  return {};
}

}  // namespace remat::models
