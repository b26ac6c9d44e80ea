// Small models the tests share.
#pragma once

#include <torch/torch.h>

namespace remat::testing {

/// `blocks` times Linear(width, hidden), GELU, Linear(hidden, width), flat in one Sequential.
inline torch::nn::Sequential linear_gelu_stack(int blocks, int64_t width, int64_t hidden) {
  torch::nn::Sequential net;
  for (int i = 0; i < blocks; ++i) {
    net->push_back(torch::nn::Linear(width, hidden));
    net->push_back(torch::nn::GELU());
    net->push_back(torch::nn::Linear(hidden, width));
  }
  return net;
}

}  // namespace remat::testing
