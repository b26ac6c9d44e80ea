// Causal attention three ways on the reference GPT's shape (B 8, H 8, T 256, D 32): plain (the
// GPT's explicit matmul-softmax-dropout-matmul), remat::ops::attention, and, on LibTorch 2.x,
// at::scaled_dot_product_attention (with the kernel it picks). Per dropout probability: exact
// activation bytes of forward + backward, step time (median of interleaved rounds, and the paired
// ratio to plain), and, without dropout, the largest gradient difference from plain.
//   remat_attention_bench [--dropout 0,0.1] [--rounds 7] [--json FILE]
#include <cmath>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/autograd.h>

#include "base/torch_compat.h"
#include "remat/memory/memory.h"
#include "remat/base/threads.h"
#include "remat/memory/memory.h"
#include "remat/ops/attention.h"
#include "remat/internal/statistics.h"

namespace {

struct Strategy {
  std::string name;
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)> attend;
};

at::Tensor plain_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double p) {
  const int64_t t = q.size(2);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  scores = scores.masked_fill(at::ones({t, t}, q.options().dtype(at::kBool)).triu(1),
                              -std::numeric_limits<double>::infinity());
  return at::matmul(at::dropout(at::softmax(scores, -1), p, /*train=*/true), v);
}

#if REMAT_TORCH_AT_LEAST(2, 1)
// The kernel scaled_dot_product_attention dispatches to for these inputs (sdp::SDPBackend).
std::string sdpa_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double p) {
  switch (at::_fused_sdp_choice(q, k, v, c10::nullopt, p, /*is_causal=*/true)) {
    case 0:
      return "math";
    case 1:
      return "flash";
    case 2:
      return "memory-efficient";
    case 3:
      return "cuDNN";
    default:
      return "other";
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Causal attention: plain, remat::ops::attention and scaled_dot_product_attention"};
  int64_t batch = 8, heads = 8, seq = 256, head_dim = 32;
  int rounds = 7, threads = 2;
  std::vector<double> dropouts = {0.0, 0.1};
  std::string json_path;
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--heads", heads)->capture_default_str();
  app.add_option("--seq", seq)->capture_default_str();
  app.add_option("--head-dim", head_dim)->capture_default_str();
  app.add_option("--rounds", rounds, "Measured interleaved rounds (after one warm-up)")->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--dropout", dropouts, "Dropout probabilities on the attention weights")->delimiter(',');
  app.add_option("--json", json_path, "Also write the figures to this JSON file");
  CLI11_PARSE(app, argc, argv);
  const std::string thread_note = remat::set_cpu_threads(threads).to_string();
  remat::keep_freed_memory_in_process();
  remat::install_cpu_memory_tracker();
  std::cout << "causal attention, B " << batch << ", H " << heads << ", T " << seq << ", D " << head_dim << ", fp32, "
            << thread_note << "; " << rounds << " interleaved rounds\n";

  nlohmann::json report = nlohmann::json::array();
  for (const double p : dropouts) {
    at::manual_seed(0);
    const auto options = at::TensorOptions().dtype(at::kFloat);
    std::vector<at::Tensor> qkv;
    for (int i = 0; i < 3; ++i) qkv.push_back(at::randn({batch, heads, seq, head_dim}, options).requires_grad_(true));
    const at::Tensor grad_out = at::randn({batch, heads, seq, head_dim}, options);
    std::vector<Strategy> strategies = {
        {"plain",
         [p](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) { return plain_attention(q, k, v, p); }},
        {"remat::ops::attention", [p](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
           return remat::ops::attention(
               q, k, v,
               remat::ops::AttentionOptions().causal(true).dropout(p).kernel(remat::ops::AttentionKernel::blocked));
         }}};
    std::string sdpa_note = "needs LibTorch 2.1+";
#if REMAT_TORCH_AT_LEAST(2, 1)
    sdpa_note = sdpa_kernel(qkv[0], qkv[1], qkv[2], p);
    strategies.push_back({"scaled_dot_product_attention (" + sdpa_note + ")",
                          [p](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
                            return at::scaled_dot_product_attention(q, k, v, c10::nullopt, p, /*is_causal=*/true);
                          }});
#endif
    const size_t n = strategies.size();
    std::vector<std::vector<double>> seconds(n);
    std::vector<int64_t> peak(n, 0);
    std::vector<std::vector<at::Tensor>> grads(n);
    for (int round = -1; round < rounds; ++round) {
      for (size_t s = 0; s < n; ++s) {
        for (auto& t : qkv) t.mutable_grad() = at::Tensor();
        at::manual_seed(1 + round);
        const remat::StepMeasurement m =
            remat::measure_step([&] { return (strategies[s].attend(qkv[0], qkv[1], qkv[2]) * grad_out).sum(); });
        if (round < 0) continue;
        seconds[s].push_back(m.step_seconds);
        peak[s] = std::max(peak[s], m.activation_peak_bytes());
        if (round == 0) {
          grads[s].clear();
          for (auto& t : qkv) grads[s].push_back(t.grad().clone());
        }
      }
    }
    std::cout << "\ndropout " << p << "\n"
              << std::left << std::setw(48) << "strategy" << std::right << std::setw(14) << "activation"
              << std::setw(12) << "step ms" << std::setw(12) << "vs plain" << std::setw(16) << "max |Δgrad|"
              << "\n";
    for (size_t s = 0; s < n; ++s) {
      std::vector<double> ratios;
      for (int r = 0; r < rounds; ++r) ratios.push_back(seconds[s][r] / seconds[0][r]);
      double max_diff = 0;
      for (size_t g = 0; g < 3; ++g)
        max_diff = std::max(max_diff, (grads[s][g] - grads[0][g]).abs().max().item<double>());
      std::ostringstream diff;
      if (p == 0)
        diff << std::scientific << std::setprecision(2) << max_diff;
      else
        diff << "(masks differ)";
      std::cout << std::left << std::setw(48) << strategies[s].name << std::right << std::setw(14)
                << remat::format_bytes(peak[s]) << std::setw(12) << std::fixed << std::setprecision(1)
                << 1000 * remat::median(seconds[s]) << std::setw(11) << std::showpos << std::setprecision(1)
                << 100 * (remat::median(ratios) - 1) << "%" << std::noshowpos << std::setw(16) << diff.str() << "\n";
      report.push_back({{"dropout", p},
                        {"strategy", strategies[s].name},
                        {"activation_peak_bytes", peak[s]},
                        {"step_seconds", remat::median(seconds[s])},
                        {"paired_ratio_to_plain", remat::median(ratios)},
                        {"max_grad_difference", p == 0 ? nlohmann::json(max_diff) : nlohmann::json(nullptr)}});
    }
  }
  if (!json_path.empty()) std::ofstream(json_path) << report.dump(2) << "\n";
  return 0;
}
