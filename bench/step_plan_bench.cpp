// remat::PlannedStep (remat/graph/planned_step.h) on the reference GPT's whole training step, its
// forward unchanged: the step recorded once per budget, planned, then unplanned and planned steps
// interleaved; per budget the predicted and measured peaks, median step times with their spread,
// and the time to record and plan. Gradients of the first planned step are compared bitwise with
// the unplanned step's from the same RNG state.
//   remat_step_plan_bench                       reference GPT, budgets 30%,50%,70%, 21 steps
//   remat_step_plan_bench --layers 2 --steps 5 --budgets 50%
#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include "remat/base/error.h"
#include "remat/graph/planned_step.h"
#include "remat/memory/memory.h"
#include "remat/models/gpt.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Measured {
  int64_t peak = 0;
  double seconds = 0;
};

Measured measure(const std::function<at::Tensor()>& step) {
  remat::reset_peak_memory();
  const int64_t before = remat::memory_stats().current_bytes;
  const auto start = std::chrono::steady_clock::now();
  step().backward();
  Measured m;
  m.seconds = seconds_since(start);
  m.peak = remat::memory_stats().peak_bytes - before;
  return m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app("remat::PlannedStep on the reference GPT's training step.", "remat_step_plan_bench");
  int64_t layers = 8, batch = 8, sequence = 256;
  int steps = 21;
  int threads = 2;
  std::vector<std::string> budgets = {"30%", "50%", "70%"};
  app.add_option("--layers", layers)->check(CLI::Range(1, 64));
  app.add_option("--batch", batch)->check(CLI::Range(1, 64));
  app.add_option("--seq", sequence)->check(CLI::Range(8, 1024));
  app.add_option("--steps", steps, "measured steps of each kind per budget")->check(CLI::Range(1, 1000));
  app.add_option("--threads", threads)->check(CLI::Range(1, 64));
  app.add_option("--budgets", budgets, "budgets, shares of the unplanned peak or bytes")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(threads);
  remat::keep_freed_memory_in_process();
  remat::install_cpu_memory_tracker();
  torch::manual_seed(0);
  remat::models::Gpt model(remat::models::GptConfig().layers(layers).sequence(sequence));
  for (auto& p : model->parameters()) p.mutable_grad() = torch::zeros_like(p);
  const at::Tensor tokens = torch::randint(256, {batch, sequence});
  const at::Tensor targets = torch::randint(256, {batch, sequence});
  auto forward = [&] { return model->forward(tokens, targets); };
  auto grads = [&] {
    std::vector<at::Tensor> out;
    for (auto& p : model->parameters()) {
      out.push_back(p.grad().clone());
      p.grad().zero_();
    }
    return out;
  };
  std::cout << "reference GPT, " << layers << " layers, batch " << batch << ", sequence " << sequence << ", "
            << threads << " threads\n";
  std::cout << std::fixed << std::setprecision(1);
  for (const std::string& budget : budgets) {
    remat::PlannedStep step(remat::Budget::parse(budget));
    torch::manual_seed(1);
    auto start = std::chrono::steady_clock::now();
    step.run(forward).backward();
    const double record_seconds = seconds_since(start);
    grads();
    torch::manual_seed(2);
    start = std::chrono::steady_clock::now();
    const Measured first = measure([&] { return step.run(forward); });
    const double first_seconds = seconds_since(start);
    const auto planned_grads = grads();
    torch::manual_seed(2);
    measure(forward);
    const auto unplanned_grads = grads();
    bool equal = true;
    for (size_t i = 0; i < planned_grads.size(); ++i) equal = equal && planned_grads[i].equal(unplanned_grads[i]);
    const remat::StepPlan& plan = step.plan();
    std::vector<double> plain_times, planned_times;
    int64_t plain_peak = 0, planned_peak = first.peak;
    for (int i = 0; i < steps; ++i) {
      const Measured a = measure(forward);
      const Measured b = measure([&] { return step.run(forward); });
      plain_times.push_back(a.seconds);
      planned_times.push_back(b.seconds);
      plain_peak = std::max(plain_peak, a.peak);
      planned_peak = std::max(planned_peak, b.peak);
      grads();
    }
    std::vector<double> ratios;
    for (int i = 0; i < steps; ++i) ratios.push_back(planned_times[i] / plain_times[i]);
    std::sort(ratios.begin(), ratios.end());
    std::cout << plan.to_string();
    std::cout << "budget " << budget << ": peak " << remat::mebibytes(planned_peak) << " MiB (budget "
              << remat::mebibytes(plan.budget_bytes) << ", predicted " << remat::mebibytes(plan.predicted_peak_bytes)
              << ", unplanned " << remat::mebibytes(plain_peak) << "), "
              << (planned_peak <= plan.budget_bytes ? "within budget" : "OVER BUDGET") << "; step "
              << median(planned_times) * 1e3 << " ms vs unplanned " << median(plain_times) * 1e3 << " ms (ratio "
              << std::setprecision(3) << ratios[ratios.size() / 2] << ", spread " << ratios.front() << "-"
              << ratios.back() << std::setprecision(1) << "); record step " << record_seconds * 1e3
              << " ms, plan + first planned step " << first_seconds * 1e3 << " ms (plan " << plan.plan_seconds * 1e3
              << " ms); gradients " << (equal ? "bitwise equal" : "DIFFER") << "\n";
  }
  return 0;
} catch (const c10::Error& e) {
  std::cerr << "remat_step_plan_bench: " << e.what_without_backtrace() << "\n";
  return 1;
}
