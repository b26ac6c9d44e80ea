// Small sequential models the planning tests share: an MLP with dropout, a conv net with BatchNorm
// (and a guard making its convolutions reproducible), a chain counting its stage runs, a plan's segments.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/Context.h>
#include <torch/torch.h>

#include "remat/chain/plan.h"
#include "remat/chain/sequential_chain.h"

namespace remat::testing {

inline torch::nn::Sequential mlp(int64_t layers = 6, int64_t width = 32) {
  torch::manual_seed(0);
  torch::nn::Sequential net;
  for (int64_t i = 0; i < layers; ++i) {
    net->push_back(torch::nn::Linear(width, 4 * width));
    net->push_back(torch::nn::GELU());
    net->push_back(torch::nn::Dropout(0.1));
    net->push_back(torch::nn::Linear(4 * width, width));
  }
  net->push_back(torch::nn::Linear(width, 10));
  return net;
}

inline torch::nn::Sequential convnet() {
  torch::manual_seed(0);
  return torch::nn::Sequential(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)), torch::nn::BatchNorm2d(8), torch::nn::ReLU(),
      torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3).padding(1)), torch::nn::BatchNorm2d(8), torch::nn::ReLU(),
      torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3).padding(1)), torch::nn::BatchNorm2d(8), torch::nn::ReLU(),
      torch::nn::Flatten(), torch::nn::Linear(8 * 16 * 16, 10));
}

// Debian's LibTorch 2.6 runs these nets' convolutions through oneDNN, which on some CPUs (AMD EPYC
// with AVX-512, two threads) is not reproducible: two plain runs differ, even by NaN, without remat
// (docs/results.md). Tests comparing two runs bitwise need a reproducible reference: LibTorch's own
// convolution, for the test's duration.
struct ReproducibleConvolutions {
  bool was = at::globalContext().userEnabledMkldnn();
  ReproducibleConvolutions() { at::globalContext().setUserEnabledMkldnn(false); }
  ~ReproducibleConvolutions() { at::globalContext().setUserEnabledMkldnn(was); }
};

inline int count_segments(const std::vector<remat::PlanItem>& items) {
  int n = 0;
  for (const auto& item : items) n += item.is_stage() ? 0 : 1 + count_segments(item.segment);
  return n;
}

// Counts the stage runs profiling makes.
struct CountingChain : remat::SequentialChain {
  using remat::SequentialChain::SequentialChain;
  std::map<int64_t, int> runs;
  at::Tensor forward_stage(int64_t index, const at::Tensor& input, const std::string& option) override {
    ++runs[index];
    return remat::SequentialChain::forward_stage(index, input, option);
  }
};

}  // namespace remat::testing
