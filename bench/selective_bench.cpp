// What seeing operator calls costs: a function of many cheap operator calls checkpointed plainly
// (check_reads off), with check_reads (the default), and with a selective policy that keeps nothing (so every call is intercepted
// and recomputed, and only the interception differs), in both modes, interleaved rounds. Prints µs
// per operator call for the forward and for a whole step, and the per-call overhead of a plain
// checkpoint on the tiny function (mul + tanh) beside a checkpoint with a policy.
// Threads are set as a user's program sets them: at::set_num_threads (--threads).
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "remat/checkpoint/checkpoint.h"
#include "remat/internal/statistics.h"
#include "remat/checkpoint/selective.h"

namespace {

using remat::seconds_per_call;

struct Spread {
  double median, low, high;
};

Spread spread_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {remat::median(v), v.front(), v.back()};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"remat selective benchmark: what intercepting operator calls costs"};
  int calls = 300, rounds = 21, threads = 2, ops = 64;
  std::string json_path;
  app.add_option("--calls", calls, "Checkpoint calls per round")->capture_default_str();
  app.add_option("--rounds", rounds, "Interleaved rounds")->capture_default_str();
  app.add_option("--ops", ops, "Operator calls in the function")->capture_default_str();
  app.add_option("--threads", threads, "at::set_num_threads, as a user's program sets it")->capture_default_str();
  app.add_option("--json", json_path, "Also write the figures to this JSON file");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(threads);

  at::Tensor w = torch::randn({16}, torch::requires_grad());
  at::Tensor x = torch::randn({16}, torch::requires_grad());
  auto many = [&](const at::Tensor& in) {
    at::Tensor h = in;
    for (int i = 0; i < ops / 2; ++i) h = (h * w).tanh();  // two operator calls each
    return h;
  };
  auto tiny = [&](const at::Tensor& in) { return (in * w).tanh(); };
  const auto keep_nothing = [](const remat::OperatorCall&) { return remat::CheckpointPolicy::prefer_recompute; };

  nlohmann::json j = {{"threads", threads}, {"ops", ops}, {"rounds", rounds}};
  const double us = 1e6;
  for (const auto mode : {remat::CheckpointMode::reentrant, remat::CheckpointMode::non_reentrant}) {
    const auto plain = remat::CheckpointOptions().mode(mode).check_reads(false);
    const auto reads = remat::CheckpointOptions().mode(mode);  // the default: check_reads on
    const auto policy = remat::CheckpointOptions().mode(mode).selective(keep_nothing).check_reads(false);
    const auto policy_reads = remat::CheckpointOptions().mode(mode).selective(keep_nothing);
    const std::vector<std::pair<std::string, remat::CheckpointOptions>> variants = {
        {"plain", plain}, {"check_reads", reads}, {"policy", policy}, {"policy+check_reads", policy_reads}};
    std::vector<std::vector<double>> forward(variants.size()), step(variants.size()), tiny_step(variants.size());
    std::vector<double> direct_tiny_step;
    for (int r = -1; r < rounds; ++r) {
      std::vector<double> f(variants.size()), s(variants.size()), t(variants.size());
      for (size_t v = 0; v < variants.size(); ++v) {
        f[v] = seconds_per_call(calls, [&] { remat::checkpoint(many, x, variants[v].second); });
        s[v] = seconds_per_call(calls, [&] { remat::checkpoint(many, x, variants[v].second).sum().backward(); });
        t[v] = seconds_per_call(calls, [&] { remat::checkpoint(tiny, x, variants[v].second).sum().backward(); });
      }
      const double d = seconds_per_call(calls, [&] { tiny(x).sum().backward(); });
      if (r < 0) continue;
      direct_tiny_step.push_back(d);
      for (size_t v = 0; v < variants.size(); ++v) {
        forward[v].push_back(f[v]);
        step[v].push_back(s[v]);
        tiny_step[v].push_back(t[v]);
      }
    }
    std::cout << "mode " << remat::to_string(mode) << ", " << ops << " operator calls, median [min, max] of " << rounds
              << " interleaved rounds of " << calls << " calls, " << threads << " threads:\n";
    for (size_t v = 1; v < variants.size(); ++v) {
      // Paired per round: the variant against the plain checkpoint of the same round.
      std::vector<double> per_op_forward, per_op_step;
      for (int r = 0; r < rounds; ++r) {
        per_op_forward.push_back((forward[v][r] - forward[0][r]) / ops * us);
        per_op_step.push_back((step[v][r] - step[0][r]) / ops * us);
      }
      const Spread pf = spread_of(per_op_forward), ps = spread_of(per_op_step);
      std::cout << "  " << variants[v].first << ": +" << pf.median << " us per operator call in the forward [" << pf.low
                << ", " << pf.high << "], +" << ps.median << " us per call over forward and backward [" << ps.low
                << ", " << ps.high << "]\n";
      const std::string key = std::string(remat::to_string(mode)) + "_" + variants[v].first;
      j[key + "_forward_us_per_op"] = pf.median;
      j[key + "_step_us_per_op"] = ps.median;
    }
    std::vector<double> overhead_plain, overhead_policy;
    for (int r = 0; r < rounds; ++r) {
      overhead_plain.push_back((tiny_step[0][r] - direct_tiny_step[r]) * us);
      overhead_policy.push_back((tiny_step[3][r] - direct_tiny_step[r]) * us);
    }
    const Spread op = spread_of(overhead_plain), oq = spread_of(overhead_policy);
    std::cout << "  tiny function (mul + tanh), forward + backward: plain checkpoint +" << op.median << " us ["
              << op.low << ", " << op.high << "] over the direct call, with a policy +" << oq.median << " us ["
              << oq.low << ", " << oq.high << "]\n";
    j[std::string(remat::to_string(mode)) + "_tiny_step_overhead_us"] = op.median;
    j[std::string(remat::to_string(mode)) + "_tiny_step_overhead_policy_us"] = oq.median;
  }
  if (!json_path.empty()) std::ofstream(json_path) << j.dump(2) << "\n";
  return 0;
}
