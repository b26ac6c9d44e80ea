// An encoder-decoder Transformer (LibTorch's own torch::nn::Transformer, unmodified) under a memory
// budget, planned over its graph (remat/graph/planned_step.h): every decoder layer's cross-attention
// reads the encoder's output, so no chain of stages describes the model, and its forward is
// LibTorch's. The step is recorded once; a plan keeps or drops each tensor autograd saves; later
// steps rebuild the dropped ones in backward by replaying the recorded operator calls, dropout's
// masks drawn again from the RNG state they had.
//
//   remat::PlannedStep step("50%");
//   auto loss = step.run([&] { return F::mse_loss(transformer->forward(src, tgt, {}, mask), target); });
//   loss.backward();
//
//   remat_encoder_decoder   trains 4 steps at each budget beside a plain copy; exits 1 unless every
//                           planned step is within its budget with gradients bitwise equal
#include <cstdlib>
#include <iostream>

#include <torch/torch.h>

#include "support/planned_training.h"

namespace nn = torch::nn;
namespace F = torch::nn::functional;

int main() try {
  at::set_num_threads(2);
  remat::install_cpu_memory_tracker();               // exact bytes on CPU
  const at::Tensor src = torch::randn({48, 8, 64});  // (source length, batch, d_model)
  const at::Tensor tgt = torch::randn({32, 8, 64});  // (target length, batch, d_model)
  const at::Tensor target = torch::randn({32, 8, 64});
  const at::Tensor causal = nn::TransformerImpl::generate_square_subsequent_mask(32);
  auto options = nn::TransformerOptions(64, 4).num_encoder_layers(3).num_decoder_layers(3).dim_feedforward(256);
  auto loss_of = [&](nn::Transformer& net) { return F::mse_loss(net->forward(src, tgt, {}, causal), target); };
  bool ok = true;
  for (const char* budget : {"30%", "50%", "70%"}) {
    torch::manual_seed(0);
    nn::Transformer plain(options);
    torch::manual_seed(0);
    nn::Transformer planned(options);  // the same parameters
    ok = example::train_side_by_side(budget, plain, planned, loss_of, 4) && ok;
  }
  std::cout << (ok ? "every planned step within its budget, gradients bitwise equal\n" : "FAILED\n");
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
} catch (const c10::Error& e) {
  std::cerr << "remat_encoder_decoder: " << e.what_without_backtrace() << "\n";
  return EXIT_FAILURE;
}
