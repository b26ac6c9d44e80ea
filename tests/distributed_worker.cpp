// One rank (or the single process) of the data-parallel equivalence tests, run as real processes
// over loopback by tests/distributed_test.sh:
//
//   distributed_worker net <ranks> <out>          a model checkpointing one module twice, a parameter
//                                                 used inside and outside a checkpoint, an unused one,
//                                                 Checkpointed, checkpoint_sequential and nesting
//   distributed_worker net-accumulate <ranks> <out>   the same in two micro-batches, the first under no_sync
//   distributed_worker net-dynamic <ranks> <out>      from step 2 on, the unused parameter is used
//   distributed_worker gpt <ranks> <out> <how> [batch]   remat's Trainer, <how> a policy or budget:<B>
//   distributed_worker compare <a> <b> <tol>      max |a - b| over the saved parameters
//
// With ranks 1 the process trains alone on the whole global batch; otherwise it is the rank named
// by RANK (WORLD_SIZE, MASTER_ADDR, MASTER_PORT set by the script) and trains on its slice. Rank 0
// (or the single process) writes the parameters after 5 optimiser steps to <out>, and prints each
// step's activation peak.
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <optional>

#include <torch/torch.h>

#include "remat/checkpoint/checkpoint.h"
#include "remat/checkpoint/checkpointed.h"
#include "remat/distributed/data_parallel.h"
#include "remat/memory/memory.h"
#include "remat/train/trainer.h"

namespace nn = torch::nn;

struct NetImpl : nn::Module {
  NetImpl()
      : a(register_module("a", nn::Linear(16, 16))),
        b(register_module("b", nn::Linear(16, 16))),
        unused(register_module("unused", nn::Linear(16, 16))),
        wrapped(register_module("wrapped", remat::Checkpointed(nn::Linear(16, 16)))),
        stack(register_module("stack", nn::Sequential(nn::Linear(16, 16), nn::Tanh(), nn::Linear(16, 16), nn::Tanh()))),
        head(register_module("head", nn::Linear(16, 4))) {}
  at::Tensor forward(const at::Tensor& x, bool extra_use = false) {
    at::Tensor h = remat::checkpoint([&](const at::Tensor& in) { return torch::tanh(a(in)); }, x);
    if (extra_use) h = h + 0.1 * unused(h);  // a parameter without a gradient in the first step
    h = remat::checkpoint([&](const at::Tensor& in) { return torch::tanh(a(in)) + b(in); }, h);  // `a` again
    h = h + 0.5 * b(h);  // `b` outside a checkpoint too
    h = wrapped(h);
    h = remat::checkpoint_sequential(stack, 2, h);
    h = remat::checkpoint(
        [&](const at::Tensor& in) {
          return 2 * remat::checkpoint([&](const at::Tensor& inner) { return torch::tanh(a(inner)); }, in);
        },
        h);  // nested
    return head(h);
  }
  nn::Linear a, b, unused;
  remat::Checkpointed wrapped;
  nn::Sequential stack;
  nn::Linear head;
};
TORCH_MODULE(Net);

void save(const std::vector<at::Tensor>& parameters, const std::string& out) {
  std::vector<at::Tensor> copies;
  for (const auto& p : parameters) copies.push_back(p.detach().clone());
  torch::save(copies, out);
}

int run_net(int ranks, const std::string& out, bool accumulate, bool dynamic = false) {
  std::shared_ptr<remat::distributed::ProcessGroup> group;
  int rank = 0;
  if (ranks > 1) {
    group = remat::distributed::ProcessGroup::join();
    rank = group->rank();
  }
  torch::manual_seed(0);
  Net net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  std::unique_ptr<remat::distributed::GradientSynchronizer> sync;
  if (group) {
    sync = std::make_unique<remat::distributed::GradientSynchronizer>(
        group, net->parameters(), remat::distributed::SynchronizerOptions().bucket_bytes(2048));  // several buckets
    sync->broadcast_parameters();
  }
  const int64_t global = 8, local = global / ranks;
  for (int step = 0; step < 5; ++step) {
    torch::manual_seed(100 + step);  // the global batch of this step, the same for every rank count
    const at::Tensor x = torch::randn({global, 16}), y = torch::randn({global, 4});
    sgd.zero_grad();
    const at::Tensor mine = x.narrow(0, rank * local, local), wanted = y.narrow(0, rank * local, local);
    if (accumulate) {  // two micro-batches: the first under no_sync, the second synchronised
      const int64_t half = local / 2;
      {
        std::optional<remat::distributed::GradientSynchronizer::NoSync> quiet;
        if (sync) quiet.emplace(*sync);
        (torch::mse_loss(net->forward(mine.narrow(0, 0, half)), wanted.narrow(0, 0, half)) / 2).backward();
      }
      (torch::mse_loss(net->forward(mine.narrow(0, half, half)), wanted.narrow(0, half, half)) / 2).backward();
    } else {
      torch::mse_loss(net->forward(mine, dynamic && step >= 2), wanted).backward();
    }
    if (sync) {
      const auto stats = sync->finish();
      if (rank == 0)
        std::cout << "step " << step << ": " << stats.buckets << " buckets, " << stats.buckets_during_backward
                  << " during backward, " << stats.buckets_reduced_again << " again\n";
    }
    sgd.step();
  }
  if (!dynamic && net->unused->weight.grad().defined()) {
    std::cerr << "the unused parameter got a gradient\n";
    return 1;
  }
  if (rank == 0) save(net->parameters(), out);
  return 0;
}

int run_gpt(int ranks, const std::string& out, const std::string& how, int64_t batch) {
  remat::train::TrainOptions o;
  o.model.layers(3).hidden(32).heads(2).sequence(16).dropout(0);  // the same masks whatever the rank count: none
  o.batch = batch > 0 ? batch : 4 / ranks;
  o.lr = 3e-3;
  o.warmup_steps = 1;
  o.steps = 5;
  o.threads = 1;
  std::string what = how;
  const bool non_reentrant = what.rfind("non-reentrant:", 0) == 0;
  if (non_reentrant) what = what.substr(14);
  if (what.rfind("budget:", 0) == 0) {
    o.plan = remat::PlanRequest::of_budget(remat::Budget::parse(what.substr(7)));
    o.plan.options().profile().repeats(1);
  } else {
    o.plan = remat::PlanRequest::of_policy(what);
  }
  if (non_reentrant) o.plan.mode(remat::CheckpointMode::non_reentrant);
  if (ranks > 1) o.process_group = remat::distributed::ProcessGroup::join();
  remat::train::Trainer trainer(o);
  const int rank = o.process_group ? o.process_group->rank() : 0;
  for (int step = 0; step < 5; ++step) {
    const auto r = trainer.step();
    if (rank == 0) std::cout << "peak " << r.activation_peak_bytes << " loss " << r.loss << "\n";
  }
  if (rank == 0) save(trainer.model()->parameters(), out);
  return 0;
}

int compare(const std::string& a, const std::string& b, double tolerance) {
  std::vector<at::Tensor> x, y;
  torch::load(x, a);
  torch::load(y, b);
  if (x.size() != y.size()) {
    std::cout << "different parameter counts: " << x.size() << " and " << y.size() << "\n";
    return 1;
  }
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, (x[i] - y[i]).abs().max().item<double>());
  std::cout << "max |difference| " << worst << " over " << x.size() << " parameters (tolerance " << tolerance << ")\n";
  return worst <= tolerance ? 0 : 1;
}

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if ((mode == "net" || mode == "net-accumulate" || mode == "net-dynamic") && argc == 4) {
      return run_net(std::atoi(argv[2]), argv[3], mode == "net-accumulate", mode == "net-dynamic");
    }
    if (mode == "gpt" && (argc == 5 || argc == 6)) {
      return run_gpt(std::atoi(argv[2]), argv[3], argv[4], argc == 6 ? std::atoll(argv[5]) : 0);
    }
    if (mode == "compare" && argc == 5) return compare(argv[2], argv[3], std::atof(argv[4]));
    std::cerr << "usage: see the comment at the top of tests/distributed_worker.cpp\n";
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << "\n";
    return 1;
  }
}
