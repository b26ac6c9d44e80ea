#include "remat/measure/plan_measurement.h"

#include <algorithm>
#include <ctime>
#include <limits>
#include <sstream>
#include <tuple>

#include <ATen/TensorOperators.h>
#include <ATen/ops/ones_like.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include "remat/chain/chain_state.h"
#include "remat/base/error.h"
#include "remat/memory/memory.h"
#include "remat/internal/statistics.h"

namespace remat {
namespace {

void zero_gradients(const std::vector<NamedTensor>& parameters) {
  c10::NoGradGuard no_grad;
  for (const auto& p : parameters) {
    if (p.tensor.grad().defined()) p.tensor.mutable_grad().zero_();
  }
}

double max_abs_difference(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() && !b.defined()) return 0.0;
  if (!a.defined() || !b.defined() || a.sizes() != b.sizes()) return std::numeric_limits<double>::infinity();
  if (a.numel() == 0) return 0.0;
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

bool equal_bits(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() && a.equal(b);
}

}  // namespace

std::vector<PlanMeasurement> measure_runs(const std::vector<PlanRun>& runs, int steps, const MeasureProgress& progress,
                                          ThreadsWhileTiming threads) {
  constexpr double kShortStepSeconds = 0.05;
  REMAT_CHECK(steps >= 1, "measure_plans: steps must be at least 1, got ", steps, ".");
  REMAT_CHECK(!runs.empty(), "measure_plans: give at least one plan.");
  for (const auto& run : runs) {
    REMAT_CHECK(run.chain != nullptr && run.input.defined(), "measure_runs: every run needs a chain and an input.");
    run.plan.validate_against(*run.chain);
  }
  if (runs.front().input.device().is_cpu()) install_cpu_memory_tracker();
  const TimingThreads timing_threads(threads);
  // One guard per distinct chain, all taken before any step: chains sharing modules then all hold
  // the state on entry, and any order of restoring puts it back.
  std::vector<std::unique_ptr<ChainStateGuard>> guards;
  std::vector<const Chain*> guarded;
  for (const auto& run : runs) {
    if (std::find(guarded.begin(), guarded.end(), run.chain) != guarded.end()) continue;
    guarded.push_back(run.chain);
    guards.push_back(std::make_unique<ChainStateGuard>(*run.chain, run.input));
  }
  std::vector<std::vector<double>> seconds(runs.size());
  std::vector<PlanMeasurement> result(runs.size());
  // A run after one of another input shape first takes an untimed step: in training every step has
  // one shape, and the first after a change pays for the caches and the allocator's free lists the
  // other left behind (on a CPU, several percent of a small batch's step).
  std::vector<bool> after_other_shape(runs.size(), false);
  for (size_t p = 0; p < runs.size(); ++p) {
    const at::Tensor& before = runs[(p + runs.size() - 1) % runs.size()].input;
    after_other_shape[p] = before.sizes() != runs[p].input.sizes();
  }
  // So does a run whose steps are short, after any other run: a plan's first step after another
  // plan's pays for what that one left in the caches (on the 0.13 ms-a-block mixer, a plan
  // checkpointing one block measured +0.52 ms after the plain plan, +0.21 ms after itself; the
  // other step is 7 ms). In training a plan follows itself. Short is judged by the process's CPU
  // time, not the wall clock: on a loaded machine a 0.2 ms step can wait 50 ms for a core, and a
  // decision taken from that wait would change how many steps a measurement runs.
  std::vector<bool> short_steps(runs.size(), false);
  for (int round = -1; round < steps; ++round) {  // round -1 warms up (and allocates gradients)
    for (size_t p = 0; p < runs.size(); ++p) {
      if (progress) progress(round + 1, steps + 1, p);
      Chain& chain = *runs[p].chain;
      const auto step = [&] {
        if (runs[p].prepare) runs[p].prepare();
        zero_gradients(chain_parameters(chain));
        return measure_step(
            [&] {
              // A chain without a loss (Planned's) is back-propagated from ones, through its sum.
              at::Tensor output = run_plan(chain, runs[p].plan, runs[p].input);
              return output.numel() == 1 ? output : output.sum();
            },
            runs[p].input.device());
      };
      if (round >= 0 && (after_other_shape[p] || (short_steps[p] && runs.size() > 1))) step();
      const std::clock_t cpu_before = std::clock();
      const auto m = step();
      if (round < 0) {
        const double cpu_seconds = static_cast<double>(std::clock() - cpu_before) / CLOCKS_PER_SEC;
        // The lesser of the two: CPU time adds up every thread (spinning ones too), and a GPU wait
        // that blocks costs no CPU time at all.
        short_steps[p] = std::min(cpu_seconds, m.step_seconds) < kShortStepSeconds;
        continue;
      }
      seconds[p].push_back(m.step_seconds);
      result[p].activation_peak_bytes = std::max(result[p].activation_peak_bytes, m.activation_peak_bytes());
    }
  }
  for (size_t p = 0; p < runs.size(); ++p) {
    result[p].step_seconds = median(seconds[p]);
    result[p].all_step_seconds = seconds[p];
    result[p].threads = timing_threads.description();
  }
  return result;
}

std::vector<PlanMeasurement> measure_plans(const std::function<Chain&(const Plan&)>& chain_for,
                                           const std::vector<Plan>& plans, const at::Tensor& input, int steps,
                                           const MeasureProgress& progress, ThreadsWhileTiming threads) {
  std::vector<PlanRun> runs;
  for (const auto& plan : plans) runs.push_back({&chain_for(plan), plan, input, {}});
  return measure_runs(runs, steps, progress, threads);
}

PairedRatio paired_time_ratios(const PlanMeasurement& plan, const PlanMeasurement& baseline) {
  const size_t rounds = plan.all_step_seconds.size();
  REMAT_CHECK(rounds > 0 && rounds == baseline.all_step_seconds.size(),
              "paired_time_ratio: both measurements must come from the same interleaved rounds (", rounds, " and ",
              baseline.all_step_seconds.size(), " steps).");
  std::vector<double> ratios;
  for (size_t r = 0; r < rounds; ++r) ratios.push_back(plan.all_step_seconds[r] / baseline.all_step_seconds[r]);
  PairedRatio result;
  result.median = median(ratios);
  std::tie(result.low, result.high) = median_interval(ratios);
  result.rounds = rounds;
  return result;
}

double paired_time_ratio(const PlanMeasurement& plan, const PlanMeasurement& baseline) {
  return paired_time_ratios(plan, baseline).median;
}

std::optional<size_t> fastest_fitting(const std::vector<PlanMeasurement>& measured,
                                      const std::vector<size_t>& candidates, int64_t budget_bytes, size_t baseline) {
  REMAT_CHECK(baseline < measured.size(), "fastest_fitting: baseline ", baseline, " is not one of the ",
              measured.size(), " measurements.");
  std::optional<size_t> best;
  double best_ratio = 0;
  for (size_t i : candidates) {
    REMAT_CHECK(i < measured.size(), "fastest_fitting: candidate ", i, " is not one of the ", measured.size(),
                " measurements.");
    if (measured[i].activation_peak_bytes > budget_bytes) continue;
    const double ratio = paired_time_ratio(measured[i], measured[baseline]);
    if (!best || ratio < best_ratio) {
      best = i;
      best_ratio = ratio;
    }
  }
  return best;
}

std::vector<PlanMeasurement> measure_plans(Chain& chain, const std::vector<Plan>& plans, const at::Tensor& input,
                                           int steps, const MeasureProgress& progress, ThreadsWhileTiming threads) {
  return measure_plans([&chain](const Plan&) -> Chain& { return chain; }, plans, input, steps, progress, threads);
}

double PlanVerification::max_gradient_difference() const {
  double out = 0;
  for (const auto& g : gradients) out = std::max(out, g.max_abs_difference);
  return out;
}

double PlanVerification::max_buffer_difference() const {
  double out = 0;
  for (const auto& b : buffers) out = std::max(out, b.max_abs_difference);
  return out;
}

std::string PlanVerification::to_string() const {
  std::ostringstream os;
  os << (bitwise_equal() ? "bitwise equal to the unchecked step" : "differs from the unchecked step")
     << ": output max |d| " << output_max_abs_difference << ", gradients max |d| " << max_gradient_difference()
     << " over " << gradients.size() << " parameters, buffers max |d| " << max_buffer_difference() << " over "
     << buffers.size() << " buffers\n";
  for (const auto* list : {&gradients, &buffers}) {
    for (const auto& d : *list) {
      if (d.max_abs_difference != 0) os << "  " << d.name << ": max |d| " << d.max_abs_difference << "\n";
    }
  }
  return os.str();
}

PlanVerification verify_plan(Chain& chain, const Plan& plan, const at::Tensor& input) {
  plan.validate_against(chain);
  REMAT_CHECK(c10::GradMode::is_enabled(), "verify_plan: grad mode is disabled; call it outside torch::NoGradGuard.");
  ChainStateGuard guard(chain, input);
  const auto parameters = chain_parameters(chain);
  const auto buffers = chain_buffers(chain);

  struct Step {
    at::Tensor output;
    std::vector<at::Tensor> gradients, buffers;
  };
  auto run = [&](const Plan& p) {
    guard.restore_buffers();
    guard.restore_rng();
    {
      c10::NoGradGuard no_grad;
      for (const auto& parameter : parameters) parameter.tensor.mutable_grad() = at::Tensor();
    }
    Step step;
    at::Tensor out = run_plan(chain, p, input);
    REMAT_CHECK(out.requires_grad(), "verify_plan: the chain's output does not require grad; nothing to compare.");
    torch::autograd::backward({out}, {at::ones_like(out)});
    step.output = out.detach().clone();
    for (const auto& parameter : parameters) {
      step.gradients.push_back(parameter.tensor.grad().defined() ? parameter.tensor.grad().clone() : at::Tensor());
    }
    for (const auto& b : buffers) step.buffers.push_back(b.tensor.detach().clone());
    return step;
  };
  Plan unchecked = Plan::unchecked(chain);
  unchecked.options = plan.options;
  const Step plain = run(unchecked);
  const Step planned = run(plan);

  PlanVerification v;
  v.output_max_abs_difference = max_abs_difference(plain.output, planned.output);
  bool bits = equal_bits(plain.output, planned.output);
  for (size_t i = 0; i < parameters.size(); ++i) {
    v.gradients.push_back({parameters[i].name, max_abs_difference(plain.gradients[i], planned.gradients[i])});
    bits = bits && equal_bits(plain.gradients[i], planned.gradients[i]);
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    v.buffers.push_back({buffers[i].name, max_abs_difference(plain.buffers[i], planned.buffers[i])});
    bits = bits && equal_bits(plain.buffers[i], planned.buffers[i]);
  }
  v.identical = bits;
  return v;
}

int64_t measure_plan_peak(Chain& chain, const Plan& plan, const at::Tensor& sample_input) {
  plan.validate_against(chain);
  const c10::Device device = sample_input.device();
  if (device.is_cpu()) install_cpu_memory_tracker();
  const ChainStateGuard untouched(chain, sample_input);
  int64_t peak = 0;
  for (int round = 0; round < 2; ++round) {  // the first allocates gradients, as a first step does
    {
      c10::NoGradGuard no_grad;
      for (const auto& p : chain_parameters(chain)) {
        if (p.tensor.grad().defined()) p.tensor.mutable_grad().zero_();
      }
    }
    synchronize_device(device);
    const int64_t before = memory_stats(device).current_bytes;
    reset_peak_memory(device);
    {
      at::Tensor output = run_plan(chain, plan, sample_input);
      REMAT_CHECK(output.requires_grad(), "measuring a plan: the chain's output does not require grad.");
      torch::autograd::backward({output}, {at::ones_like(output)});
    }
    synchronize_device(device);
    peak = memory_stats(device).peak_bytes - before;
  }
  return peak;
}

}  // namespace remat
