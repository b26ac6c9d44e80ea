// A U-Net under a memory budget, planned over its graph (remat/graph/planned_step.h): its forward is
// an ordinary LibTorch module's, with skip concatenations from every encoder level to the decoder,
// so no chain of stages describes it. The step is recorded once, a plan keeps or drops each tensor
// autograd saves, and later steps rebuild the dropped ones in backward by replaying the recorded
// operator calls.
//
//   remat::PlannedStep step("50%");
//   auto loss = step.run([&] { return F::cross_entropy(unet->forward(images), labels); });
//   loss.backward();
//
//   remat_unet        trains 4 steps at 50% and 70% of the plain step's peak beside a plain
//                     copy; exits 1 unless every planned step is within its budget and its gradients
//                     are bitwise equal to the plain copy's
#include <cstdlib>
#include <iostream>

#include <torch/torch.h>

#include "support/planned_training.h"

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct DoubleConvImpl : nn::Module {
  DoubleConvImpl(int64_t in, int64_t out)
      : conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1).bias(false)))),
        bn1(register_module("bn1", nn::BatchNorm2d(out))),
        conv2(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)))),
        bn2(register_module("bn2", nn::BatchNorm2d(out))) {}
  // One operation a statement: a C++ full expression keeps every temporary in it alive until it
  // ends, so the nested form would hold all five intermediates at once, whatever the plan drops.
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = conv1(x);
    h = torch::relu(bn1(h));
    h = conv2(h);
    return torch::relu(bn2(h));
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Conv2d conv2;
  nn::BatchNorm2d bn2;
};
TORCH_MODULE(DoubleConv);

struct UNetImpl : nn::Module {
  UNetImpl()
      : enc1(register_module("enc1", DoubleConv(3, 16))),
        enc2(register_module("enc2", DoubleConv(16, 32))),
        bottom(register_module("bottom", DoubleConv(32, 64))),
        up2(register_module("up2", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(64, 32, 2).stride(2)))),
        dec2(register_module("dec2", DoubleConv(64, 32))),
        up1(register_module("up1", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(32, 16, 2).stride(2)))),
        dec1(register_module("dec1", DoubleConv(32, 16))),
        head(register_module("head", nn::Conv2d(nn::Conv2dOptions(16, 4, 1)))) {}
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor e1 = enc1(x);
    const at::Tensor e2 = enc2(F::max_pool2d(e1, F::MaxPool2dFuncOptions(2)));
    at::Tensor h = bottom(F::max_pool2d(e2, F::MaxPool2dFuncOptions(2)));
    h = dec2(torch::cat({up2(h), e2}, 1));  // skip from the second level
    h = dec1(torch::cat({up1(h), e1}, 1));  // and from the first
    return head(h);
  }
  DoubleConv enc1, enc2, bottom;
  nn::ConvTranspose2d up2;
  DoubleConv dec2;
  nn::ConvTranspose2d up1;
  DoubleConv dec1;
  nn::Conv2d head;
};
TORCH_MODULE(UNet);

int main() try {
  at::set_num_threads(2);
  remat::install_cpu_memory_tracker();  // exact bytes on CPU
  const at::Tensor images = torch::randn({4, 3, 64, 64});
  const at::Tensor labels = torch::randint(4, {4, 64, 64});
  auto loss_of = [&](UNet& net) { return F::cross_entropy(net->forward(images), labels); };
  bool ok = true;
  for (const char* budget : {"50%", "70%"}) {  // 30%: below what any plan reaches (docs/graph_planning.md)
    torch::manual_seed(0);
    UNet plain;
    torch::manual_seed(0);
    UNet planned;  // the same parameters
    ok = example::train_side_by_side(budget, plain, planned, loss_of, 4) && ok;
  }
  std::cout << (ok ? "every planned step within its budget, gradients bitwise equal\n" : "FAILED\n");
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
} catch (const c10::Error& e) {
  std::cerr << "remat_unet: " << e.what_without_backtrace() << "\n";
  return EXIT_FAILURE;
}
