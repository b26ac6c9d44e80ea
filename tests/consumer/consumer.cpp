#include <iostream>

#include <torch/nn/modules/linear.h>

#include <remat/checkpoint/checkpoint.h>

int main() {
  torch::nn::Linear linear(4, 4);
  at::Tensor x = at::randn({2, 4});
  remat::checkpoint([&](const at::Tensor& in) { return linear(in).relu(); }, x).sum().backward();
  const bool ok = linear->weight.grad().defined();
  std::cout << (ok ? "consumer: gradients reached the parameters\n" : "consumer: no gradient\n");
  return ok ? 0 : 1;
}
