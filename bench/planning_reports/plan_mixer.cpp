// Planning a model of sub-millisecond stages: a stack of small MLP-mixer blocks (Tolstikhin et al.
// 2021) on random patch embeddings, with dropout inside each block, token mixing over the transposed
// activation and a mean-pooled classification head. At this size a checkpoint boundary's own cost (the call,
// recording its graph, saving and restoring the RNG state) is a large part of each stage's time:
// the planner charges it per segment (cost_model.h, CostTable::segment_seconds).
//
//   remat_plan_mixer            12 blocks, 37 tokens of 72 channels, batch 6 (the size)
//   remat_plan_mixer --quick    the same, one measured step (what the tests run); --steps N: measured steps
#include <iostream>

#include <torch/torch.h>

#include "remat/autoplan/make_plan.h"
#include "remat/base/threads.h"
#include "remat/memory/memory.h"
#include "remat/chain/sequential_chain.h"
#include "budget_report.h"

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct Config {
  int64_t blocks = 12, tokens = 37, channels = 72, batch = 6, classes = 10;
};

// One mixer block, (N, T, C) -> (N, T, C): a token-mixing MLP across the T positions of each
// channel, then a channel-mixing MLP across the C channels of each token, each pre-normed, with
// dropout and a residual add.
struct MixerBlockImpl : nn::Module {
  MixerBlockImpl(int64_t tokens, int64_t channels)
      : token_norm(register_module("token_norm", nn::LayerNorm(nn::LayerNormOptions({channels})))),
        token_in(register_module("token_in", nn::Linear(tokens, 2 * tokens))),
        token_out(register_module("token_out", nn::Linear(2 * tokens, tokens))),
        channel_norm(register_module("channel_norm", nn::LayerNorm(nn::LayerNormOptions({channels})))),
        channel_in(register_module("channel_in", nn::Linear(channels, 4 * channels))),
        channel_out(register_module("channel_out", nn::Linear(4 * channels, channels))),
        dropout(register_module("dropout", nn::Dropout(0.1))) {}
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor mixed_tokens = token_out(F::gelu(token_in(token_norm(x).transpose(1, 2)))).transpose(1, 2);
    const at::Tensor y = x + dropout(mixed_tokens);
    return y + dropout(channel_out(F::gelu(channel_in(channel_norm(y)))));
  }
  nn::LayerNorm token_norm;
  nn::Linear token_in, token_out;
  nn::LayerNorm channel_norm;
  nn::Linear channel_in, channel_out;
  nn::Dropout dropout;
};
TORCH_MODULE(MixerBlock);

// The classification head: normed, mean-pooled over the tokens, (N, T, C) -> (N, classes).
struct PooledHeadImpl : nn::Module {
  PooledHeadImpl(int64_t channels, int64_t classes)
      : norm(register_module("norm", nn::LayerNorm(nn::LayerNormOptions({channels})))),
        classifier(register_module("classifier", nn::Linear(channels, classes))) {}
  at::Tensor forward(const at::Tensor& x) { return classifier(norm(x).mean(1)); }
  nn::LayerNorm norm;
  nn::Linear classifier;
};
TORCH_MODULE(PooledHead);

nn::Sequential make_mixer(const Config& c) {
  torch::manual_seed(0);
  nn::Sequential net;
  for (int64_t b = 0; b < c.blocks; ++b) net->push_back("block" + std::to_string(b), MixerBlock(c.tokens, c.channels));
  net->push_back("head", PooledHead(c.channels, c.classes));
  return net;
}

int run(int argc, char** argv) {
  remat_reports::check_arguments(argc, argv, {"--quick"}, {"--steps", "--blocks", "--tokens", "--channels", "--batch"});
  Config config;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--blocks") config.blocks = remat_reports::count_argument(flag, argv[i + 1], 1000);
    if (flag == "--tokens") config.tokens = remat_reports::count_argument(flag, argv[i + 1], 4096);
    if (flag == "--channels") config.channels = remat_reports::count_argument(flag, argv[i + 1], 4096);
    if (flag == "--batch") config.batch = remat_reports::count_argument(flag, argv[i + 1], 4096);
  }
  at::set_num_threads(2);                 // as LibTorch documents it; remat times around what it finds (threads.h)
  remat::keep_freed_memory_in_process();  // as docs/library.md advises CPU training programs
  std::cout << "remat_plan_mixer: " << config.blocks << " x MLP-mixer block (" << config.tokens << " tokens, "
            << config.channels
            << " channels, token MLP x2, channel MLP x4, GELU, dropout 0.1) and a pooled head, batch " << config.batch
            << ", " << remat::cpu_threads() << "\n";
  remat::install_cpu_memory_tracker();
  torch::manual_seed(1);
  const at::Tensor x = torch::randn({config.batch, config.tokens, config.channels});
  const at::Tensor labels = torch::randint(0, config.classes, {config.batch}, torch::kLong);
  const remat_reports::ReportOptions options = remat_reports::report_options(argc, argv);
  return remat_reports::report_budgets([&] { return make_mixer(config); },
                                       [&](const at::Tensor& logits) { return F::cross_entropy(logits, labels); }, x,
                                       options);
}

int main(int argc, char** argv) { return remat_reports::run_report(run, argc, argv); }
