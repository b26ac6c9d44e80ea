// remat::PlannedStep (remat/graph/planned_step.h) on the reference GPT's whole training step, its
// forward unchanged: the step recorded once per budget, planned, then unplanned and planned steps
// interleaved with the chain planner's plan (remat::make_plan on the GPT's half-block chain) at the
// same budget in bytes; per budget the predicted and measured peaks, median step times against the
// unplanned step's with their spread, and the time to record and plan. Gradients of the first planned step are compared bitwise with
// the unplanned step's from the same RNG state.
//   remat_step_plan_bench                       reference GPT, budgets 30%,50%,70%, 21 steps
//   remat_step_plan_bench --layers 2 --steps 5 --budgets 50%
#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include "remat/autoplan/make_plan.h"
#include "remat/base/error.h"
#include "remat/chain/plan.h"
#include "remat/graph/planned_step.h"
#include "remat/internal/statistics.h"
#include "remat/memory/memory.h"
#include "remat/planning/planner.h"
#include "remat/models/gpt.h"
#include "remat/models/gpt_planning.h"
#include "remat/models/gpt_policies.h"

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

// Round by round, `over` over `under`: "median (spread min-max)".
std::string paired_ratio(const std::vector<double>& over, const std::vector<double>& under) {
  std::vector<double> r;
  for (size_t i = 0; i < over.size() && i < under.size(); ++i) r.push_back(over[i] / under[i]);
  if (r.empty()) return "-";
  const auto [low, high] = std::minmax_element(r.begin(), r.end());
  std::ostringstream out;
  out << std::fixed << std::setprecision(3) << remat::median(r) << " (spread " << *low << "-" << *high << ")";
  return out.str();
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
  std::cout << "reference GPT, " << layers << " layers, batch " << batch << ", sequence " << sequence << ", " << threads
            << " threads\n";
  std::cout << std::fixed << std::setprecision(1);
  // The chain planner held to plain checkpointing (every stage's default option), the like-for-like
  // planner on the unchanged forward: its optimal plan on the profile with the options left out.
  remat::models::GptCosts plain_costs = remat::models::profile_gpt(model, tokens, targets, remat::ProfileOptions());
  for (auto& stage : plain_costs.half.stages) stage.options.resize(1);
  grads();
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
    // The chain planner at the same bytes, on the same model and batch.
    const remat::PlanResult chain_plan =
        remat::make_plan(remat::PlanRequest::of_budget(remat::Budget::bytes(plan.budget_bytes)),
                         remat::models::gpt_plan_subject(model, tokens, targets));
    remat::models::GptChains chains(model);
    chains.set_targets(targets);
    auto chain_forward = [&] { return remat::run_plan(chains.of(chain_plan.plan), chain_plan.plan, tokens); };
    // The best hand-placed per-block checkpointing that fits: of the rules that checkpoint whole
    // blocks, the one whose measured peak fits and that recomputes the fewest blocks.
    std::string hand_name = "none fits";
    remat::Plan hand_plan;
    int64_t hand_recomputed = std::numeric_limits<int64_t>::max();
    for (const std::string policy : {"every:4", "every:3", "segments:2", "every:2", "sqrt", "segments:4", "block"}) {
      const bool too_few =
          policy.rfind("block", 0) != 0 && policy != "sqrt" && std::stoi(policy.substr(policy.find(':') + 1)) > layers;
      if (too_few) continue;
      const remat::Plan candidate = remat::models::gpt_policy_plan(policy, layers);
      const Measured m = measure([&] { return remat::run_plan(chains.of(candidate), candidate, tokens); });
      grads();
      int64_t recomputed = 0;
      for (const auto& item : candidate.items)
        recomputed += item.is_stage() ? 0 : static_cast<int64_t>(item.segment.size());
      if (m.peak <= plan.budget_bytes && recomputed < hand_recomputed) {
        hand_name = policy;
        hand_plan = candidate;
        hand_recomputed = recomputed;
      }
    }
    auto hand_forward = [&] { return remat::run_plan(chains.of(hand_plan), hand_plan, tokens); };
    const remat::PlanResult plain_chain =
        remat::plan_optimal(plain_costs.half, remat::Budget::bytes(plan.budget_bytes));
    auto plain_chain_forward = [&] { return remat::run_plan(chains.of(plain_chain.plan), plain_chain.plan, tokens); };
    // The chain planner's plan runs the memory-efficient attention (option "fused") where it chose
    // it: the same model with that attention and nothing checkpointed, planned over its graph.
    remat::Plan fused_model = chain_plan.plan.without_checkpoints();
    bool any_fused = false;
    for (size_t i = 0; i < fused_model.options.size(); ++i) {
      const bool fused = chain_plan.plan.options[i].rfind("fused", 0) == 0;
      fused_model.options[i] = fused ? "fused" : fused_model.default_options[i];
      any_fused = any_fused || fused;
    }
    auto fused_forward = [&] { return remat::run_plan(chains.of(fused_model), fused_model, tokens); };
    remat::PlannedStep fused_step(remat::Budget::bytes(plan.budget_bytes));
    if (any_fused) {
      fused_step.run(fused_forward).backward();  // recorded
      try {
        measure([&] { return fused_step.run(fused_forward); });  // planned
      } catch (const c10::Error& e) {
        std::cout << "  graph plan of the model with the chain plan's attention: " << e.what_without_backtrace()
                  << "\n";
        any_fused = false;
      }
      grads();
    }
    std::vector<double> plain_times, planned_times, chain_times, hand_times, plain_chain_times, fused_times;
    int64_t plain_peak = 0, planned_peak = first.peak, chain_peak = 0, plain_chain_peak = 0, fused_peak = 0;
    for (int i = 0; i < steps; ++i) {
      const Measured a = measure(forward);
      const Measured b = measure([&] { return step.run(forward); });
      const Measured c = measure(chain_forward);
      const Measured d = measure(plain_chain_forward);
      if (hand_name != "none fits") hand_times.push_back(measure(hand_forward).seconds);
      if (any_fused) {
        const Measured f = measure([&] { return fused_step.run(fused_forward); });
        fused_times.push_back(f.seconds);
        fused_peak = std::max(fused_peak, f.peak);
      }
      plain_times.push_back(a.seconds);
      planned_times.push_back(b.seconds);
      chain_times.push_back(c.seconds);
      plain_chain_times.push_back(d.seconds);
      plain_peak = std::max(plain_peak, a.peak);
      planned_peak = std::max(planned_peak, b.peak);
      chain_peak = std::max(chain_peak, c.peak);
      plain_chain_peak = std::max(plain_chain_peak, d.peak);
      grads();
    }
    std::cout << plan.to_string();
    std::cout << "  chain planner, plain checkpointing (default options) at the same bytes: "
              << plain_chain.plan.to_string() << ": peak " << remat::mebibytes(plain_chain_peak) << " MiB ("
              << (plain_chain_peak <= plan.budget_bytes ? "within" : "OVER") << " budget), step "
              << remat::median(plain_chain_times) * 1e3 << " ms (ratio " << paired_ratio(plain_chain_times, plain_times)
              << "); graph plan / it " << paired_ratio(planned_times, plain_chain_times) << "\n";
    if (any_fused) {
      std::cout << "  graph plan of the model with the chain plan's attention (" << fused_model.to_string() << "):\n  "
                << fused_step.plan().to_string() << "  peak " << remat::mebibytes(fused_peak) << " MiB ("
                << (fused_peak <= plan.budget_bytes ? "within" : "OVER") << " budget), step "
                << remat::median(fused_times) * 1e3 << " ms (ratio " << paired_ratio(fused_times, plain_times)
                << "); / chain plan " << paired_ratio(fused_times, chain_times) << "\n";
    }
    if (!hand_times.empty()) {
      std::cout << "  best fitting per-block rule " << hand_name << ": step " << remat::median(hand_times) * 1e3
                << " ms; graph plan / it " << paired_ratio(planned_times, hand_times) << "\n";
    } else {
      std::cout << "  no per-block rule fits the budget\n";
    }
    std::cout << "  chain planner at the same bytes: " << chain_plan.plan.to_string() << ": peak "
              << remat::mebibytes(chain_peak) << " MiB, step " << remat::median(chain_times) * 1e3 << " ms (ratio "
              << paired_ratio(chain_times, plain_times) << "); graph plan / chain plan "
              << paired_ratio(planned_times, chain_times) << "\n";
    std::cout << "budget " << budget << ": peak " << remat::mebibytes(planned_peak) << " MiB (budget "
              << remat::mebibytes(plan.budget_bytes) << ", predicted " << remat::mebibytes(plan.predicted_peak_bytes)
              << ", unplanned " << remat::mebibytes(plain_peak) << "), "
              << (planned_peak <= plan.budget_bytes ? "within budget" : "OVER BUDGET") << "; step "
              << remat::median(planned_times) * 1e3 << " ms vs unplanned " << remat::median(plain_times) * 1e3
              << " ms (ratio " << paired_ratio(planned_times, plain_times) << std::setprecision(3) << "; predicted "
              << (plan.recorded_step_seconds + plan.predicted_recompute_seconds) / plan.recorded_step_seconds
              << ": the recorded step's " << plan.recorded_step_seconds * 1e3 << " ms + recompute)"
              << std::setprecision(1) << "; record step " << record_seconds * 1e3 << " ms, plan + first planned step "
              << first_seconds * 1e3 << " ms (plan " << plan.plan_seconds * 1e3 << " ms); gradients "
              << (equal ? "bitwise equal" : "DIFFER") << "\n";
  }
  return 0;
} catch (const c10::Error& e) {
  std::cerr << "remat_step_plan_bench: " << e.what_without_backtrace() << "\n";
  return 1;
}
