// A stack of Transformer-like residual layers, x + Dropout(Linear(GELU(Linear(LayerNorm(x))))),
// used by tests, benchmarks and `remat demo` to compare checkpointed and plain runs on one model.
// Shapes: B batch, T tokens, C channels; each layer keeps ~ B·T·(C + 4C + 4C + 4C + C) floats.
#pragma once

#include <string>
#include <vector>

#include <torch/nn/functional/activation.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "remat/checkpoint/checkpoint.h"

namespace remat::models {

class ResidualLayerImpl : public torch::nn::Module {
 public:
  ResidualLayerImpl(int64_t channels, double dropout)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({channels})))),
        up(register_module("up", torch::nn::Linear(channels, 4 * channels))),
        down(register_module("down", torch::nn::Linear(4 * channels, channels))),
        drop(register_module("drop", torch::nn::Dropout(dropout))) {}

  at::Tensor forward(const at::Tensor& x) {  // x: (B, T, C)
    at::Tensor h = up(norm(x));              // (B, T, 4C)
    h = torch::nn::functional::gelu(h);      // (B, T, 4C)
    return x + drop(down(h));                // (B, T, C)
  }

  torch::nn::LayerNorm norm;
  torch::nn::Linear up, down;
  torch::nn::Dropout drop;
};
TORCH_MODULE(ResidualLayer);

/// How `LayerStack::forward` runs its layers.
enum class StackMode { plain, checkpoint_each_layer, checkpoint_pairs_nested };

class LayerStackImpl : public torch::nn::Module {
 public:
  LayerStackImpl(int64_t layers, int64_t channels, double dropout) {
    for (int64_t i = 0; i < layers; ++i) {
      blocks.push_back(register_module("layer" + std::to_string(i), ResidualLayer(channels, dropout)));
    }
  }

  at::Tensor forward(const at::Tensor& x, StackMode mode = StackMode::plain) {
    at::Tensor h = x;
    if (mode == StackMode::plain) {
      for (auto& b : blocks) h = b(h);
    } else if (mode == StackMode::checkpoint_each_layer) {
      for (auto& b : blocks) {
        h = remat::checkpoint([layer = b.ptr()](const at::Tensor& in) { return layer->forward(in); }, h);
      }
    } else {
      // Pairs of layers checkpointed as one segment, each layer checkpointed again inside it.
      for (size_t i = 0; i < blocks.size(); i += 2) {
        std::vector<std::shared_ptr<ResidualLayerImpl>> pair;
        for (size_t j = i; j < std::min(i + 2, blocks.size()); ++j) pair.push_back(blocks[j].ptr());
        h = remat::checkpoint(
            [pair](const at::Tensor& in) {
              at::Tensor y = in;
              for (const auto& layer : pair) {
                y = remat::checkpoint([layer](const at::Tensor& z) { return layer->forward(z); }, y);
              }
              return y;
            },
            h);
      }
    }
    return h;
  }

  std::vector<ResidualLayer> blocks;
};
TORCH_MODULE(LayerStack);

}  // namespace remat::models
