// What the arrangement of CPU threads does to a training step: the same GPT step under LibTorch's
// default (an intra-op pool and OpenBLAS's pool, each a thread per CPU), under set_cpu_threads
// (OpenBLAS's pool, one intra-op thread: what the profiler and measure_plans time under), under the
// intra-op pool alone (OpenBLAS on one thread) and on one thread, in interleaved rounds: each round
// switches to each arrangement in turn and times a step after an untimed one. Prints each
// arrangement's median step with its ~95% interval, and its paired ratio to set_cpu_threads'.
//
//   remat_threads_bench                      the reference GPT (8 x 256, sequence 256, batch 8), 21 rounds
//   remat_threads_bench --layers 4 --hidden 64 --sequence 64 --rounds 41     small stages
#include <iostream>
#include <vector>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include "remat/internal/statistics.h"
#include "remat/memory/memory.h"
#include "remat/models/gpt.h"
#include "remat/base/threads.h"

int main(int argc, char** argv) {
  CLI::App app{"remat threads benchmark: one GPT step under four arrangements of the CPU threads"};
  int64_t layers = 8, hidden = 256, heads = 8, sequence = 256, batch = 8;
  int rounds = 21;
  app.add_option("--layers", layers, "GPT layers")->check(CLI::Range(1, 64));
  app.add_option("--hidden", hidden, "hidden size")->check(CLI::Range(8, 4096));
  app.add_option("--heads", heads, "attention heads")->check(CLI::Range(1, 64));
  app.add_option("--sequence", sequence, "tokens per sequence")->check(CLI::Range(1, 4096));
  app.add_option("--batch", batch, "sequences per batch")->check(CLI::Range(1, 1024));
  app.add_option("--rounds", rounds, "interleaved rounds")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  try {
    const int cpus = remat::usable_cpus();
    struct Arrangement {
      std::string name;
      remat::CpuThreads threads;
    };
    const int blas = remat::cpu_threads().blas > 0 ? cpus : 0;  // 0: no OpenBLAS pool to arrange
    std::vector<Arrangement> arrangements = {
        {"LibTorch's default (at::set_num_threads(" + std::to_string(cpus) + "))", {cpus, cpus, blas}},
        {"remat::set_cpu_threads(" + std::to_string(cpus) + ")", {cpus, blas > 0 ? 1 : cpus, blas}},
        {"intra-op pool, OpenBLAS on 1", {cpus, cpus, blas > 0 ? 1 : 0}},
        {"one thread", {cpus, 1, blas > 0 ? 1 : 0}}};
    const remat::CpuThreads found = remat::cpu_threads();

    remat::install_cpu_memory_tracker();  // measure_step's byte counts
    torch::manual_seed(0);
    remat::models::Gpt model(remat::models::GptConfig().layers(layers).hidden(hidden).heads(heads).sequence(sequence));
    const at::Tensor tokens = torch::randint(0, 256, {batch, sequence}, torch::kLong);
    const at::Tensor targets = torch::randint(0, 256, {batch, sequence}, torch::kLong);
    std::cout << "GPT " << layers << " x " << hidden << ", " << heads << " heads, sequence " << sequence << ", batch "
              << batch << "; " << rounds << " interleaved rounds on " << cpus << " CPUs\n";
    std::vector<std::vector<double>> seconds(arrangements.size());
    const auto step = [&] {
      for (auto& p : model->parameters()) {
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
      return remat::measure_step([&] { return model->forward(tokens, targets); }).step_seconds;
    };
    for (int r = -1; r < rounds; ++r) {
      for (size_t a = 0; a < arrangements.size(); ++a) {
        remat::restore_cpu_threads(arrangements[a].threads);
        step();  // untimed: the pools settle after the switch
        const double s = step();
        if (r >= 0) seconds[a].push_back(s);
      }
    }
    remat::restore_cpu_threads(found);
    for (size_t a = 0; a < arrangements.size(); ++a) {
      const auto [low, high] = remat::median_interval(seconds[a]);
      std::vector<double> ratios;
      for (size_t r = 0; r < seconds[a].size(); ++r) ratios.push_back(seconds[a][r] / seconds[1][r]);
      const auto [ratio_low, ratio_high] = remat::median_interval(ratios);
      std::cout << "  " << arrangements[a].name << ": " << arrangements[a].threads << "\n      step "
                << remat::median(seconds[a]) << " s [" << low << ", " << high << "], " << remat::median(ratios)
                << " x set_cpu_threads' [" << ratio_low << ", " << ratio_high << "]\n";
    }
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << "\n";
    return 1;
  }
  return 0;
}
