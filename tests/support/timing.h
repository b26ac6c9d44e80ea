// Test helpers for timing: the threads put back however a test ends, the arrangement LibTorch's
// defaults give a program, and stages that sleep in their forward (to be told apart by the profiler).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>
#include <utility>

#include <torch/torch.h>

#include "remat/base/threads.h"
#include "remat/chain/sequential_chain.h"

namespace remat::testing {

// Puts the process's threads back however a test ends.
struct KeepThreads {
  remat::CpuThreads saved = remat::cpu_threads();
  ~KeepThreads() {
    try {
      remat::restore_cpu_threads(saved);
    } catch (const c10::Error&) {
      at::set_num_threads(saved.intra_op);  // more threads than CPUs (test_main's 2 on one CPU)
    }
  }
};

// The arrangement LibTorch's defaults give a program on this machine, oversubscribed wherever
// OpenBLAS has its pool and there are two CPUs or more: both pools a thread per CPU (no more:
// restore_cpu_threads bounds each pool by the CPUs).
inline remat::CpuThreads oversubscribed_arrangement() {
  remat::CpuThreads threads = remat::cpu_threads();
  threads.intra_op = threads.cpus;
  if (threads.blas > 0) threads.blas = threads.cpus;
  return threads;
}

// A stage that sleeps in its forward (`milliseconds` gives each call's duration) and records the
// threads it ran under; its output is its input times a parameter, so that it has a backward.
struct SleepyImpl : torch::nn::Module {
  explicit SleepyImpl(std::function<double()> milliseconds)
      : milliseconds_(std::move(milliseconds)), scale(register_parameter("scale", torch::ones({1}))) {}
  at::Tensor forward(const at::Tensor& x) {
    seen = remat::cpu_threads();
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(milliseconds_()));
    return x * scale;
  }
  std::function<double()> milliseconds_;
  at::Tensor scale;
  remat::CpuThreads seen;
};
TORCH_MODULE(Sleepy);

// Distinct classes: distinct stage signatures, so the profiler does not pool their times as twins.
struct QuietImpl : SleepyImpl {
  using SleepyImpl::SleepyImpl;
};
TORCH_MODULE(Quiet);
struct NoisyImpl : SleepyImpl {
  using SleepyImpl::SleepyImpl;
};
TORCH_MODULE(Noisy);

inline std::function<double()> steady(double milliseconds) {
  return [milliseconds] { return milliseconds; };
}

inline at::Tensor sample() { return torch::randn({4, 8}); }

inline remat::LossFunction sum_loss() {
  return [](const at::Tensor& y) { return y.sum(); };
}

}  // namespace remat::testing
