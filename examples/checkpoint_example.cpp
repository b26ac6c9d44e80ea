// The README's usage example, built with the project: a small MLP trained a few steps with its
// hidden blocks checkpointed three ways, and the activation memory each way holds.
#include <iostream>

#include <torch/torch.h>

#include <remat/remat.h>

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t width)
      : fc1(register_module("fc1", torch::nn::Linear(width, 4 * width))),
        fc2(register_module("fc2", torch::nn::Linear(4 * width, width))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return x + fc2(torch::dropout(torch::gelu(fc1(x)), 0.1, is_training()));
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

int main() {
  remat::install_cpu_memory_tracker();  // exact bytes of every tensor allocated from here on
  torch::manual_seed(0);

  // 1. A function: checkpoint any callable of tensors; parameters it uses get their gradients.
  Block block(128);
  torch::Tensor x = torch::randn({64, 128});
  torch::Tensor y = remat::checkpoint([&](const torch::Tensor& in) { return block(in); }, x);
  y.pow(2).mean().backward();
  std::cout << "fc1.weight.grad norm after a checkpointed step: " << block->fc1->weight.grad().norm().item<float>()
            << "\n";

  // 2. A module: Checkpointed keeps parameter names, so checkpoints and state files are unchanged.
  torch::nn::Sequential model;
  for (int i = 0; i < 8; ++i) model->push_back(remat::Checkpointed(Block(128)));
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  torch::Tensor batch = torch::randn({256, 128});
  for (bool checkpointed : {false, true}) {
    for (auto& m : model->modules(/*include_self=*/false)) {
      if (auto wrapped = std::dynamic_pointer_cast<remat::CheckpointedImpl>(m)) wrapped->set_enabled(checkpointed);
    }
    optimizer.zero_grad();
    auto step = remat::measure_step([&] { return model->forward(batch).pow(2).mean(); });
    optimizer.step();
    std::cout << (checkpointed ? "Checkpointed blocks: " : "plain blocks:        ")
              << step.activation_peak_bytes() / 1024 << " KiB activation peak, "
              << step.activation_bytes_at_end_of_forward() / 1024 << " KiB held after forward\n";
  }

  // 3. A Sequential: PyTorch's checkpoint_sequential, here 4 segments of 2 blocks.
  torch::nn::Sequential plain;
  for (int i = 0; i < 8; ++i) plain->push_back(Block(128));
  auto step = remat::measure_step([&] { return remat::checkpoint_sequential(plain, 4, batch).pow(2).mean(); });
  std::cout << "checkpoint_sequential(4): " << step.activation_peak_bytes() / 1024 << " KiB activation peak\n";
  return 0;
}
