#include "remat/planning/throughput.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/json_fields.h"
#include "planning/cost_numbers.h"
#include "remat/base/error.h"
#include "remat/memory/memory.h"

namespace remat {
namespace {

// The value at `at` of the broken line through the points (x sorted ascending, distinct): linear
// between the two profiled sizes around `at`, and outside them along the segment nearest to it.
// Not one least-squares line: per-sample time is not constant in the batch on a CPU (it falls as
// kernels grow past their fixed costs, then rises as activations leave the caches), so a single
// line fitted over 1..G passes beside every profiled size and, extrapolated, goes to zero or below.
double piecewise_linear(const std::vector<double>& x, const std::vector<double>& y, double at) {
  size_t i = 0;  // the segment x[i]..x[i+1] used
  while (i + 2 < x.size() && at > x[i + 1]) ++i;
  const double slope = (y[i + 1] - y[i]) / (x[i + 1] - x[i]);
  return y[i] + slope * (at - x[i]);
}

// Every number of the tables (of one shape) fitted across the batch sizes, everything else
// required equal; the first table's source and threads are kept.
CostTable interpolate_tables(const std::vector<const CostTable*>& tables, const std::vector<double>& batches,
                             double batch) {
  for (const CostTable* other : tables) {
    const std::string difference = detail::cost_shape_difference(*tables.front(), *other);
    REMAT_CHECK(difference.empty(), "interpolate_costs: the profiles differ at ", difference,
                "; profile one chain at each batch size.");
  }
  // values[k][t]: number k of table t, in the visitor's order.
  std::vector<std::vector<double>> values;
  for (const CostTable* table : tables) {
    size_t k = 0;
    auto collect = [&](auto number) {
      if (k == values.size()) values.emplace_back();
      values[k++].push_back(static_cast<double>(number));
    };
    detail::for_each_cost_number(*table, collect, collect);
  }
  CostTable result = *tables.front();
  size_t k = 0;
  auto fitted = [&] { return std::max(0.0, piecewise_linear(batches, values[k++], batch)); };
  detail::for_each_cost_number(
      result, [&](double& seconds) { seconds = fitted(); },
      [&](int64_t& bytes) {
        const double at = std::ceil(fitted());
        REMAT_CHECK(at <= static_cast<double>(detail::kMaxBytes), "interpolate_costs: a size extrapolated to batch ",
                    batch, " passes 2^53 bytes; profile batch sizes nearer to it.");
        bytes = static_cast<int64_t>(at);
      });
  for (auto& stage : result.stages) stage.measured_rounds = 0;  // fitted, not measured
  return result;
}

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

}  // namespace

CostTable interpolate_costs(const std::vector<std::pair<int64_t, CostTable>>& profiled, int64_t batch) {
  REMAT_CHECK(!profiled.empty(), "interpolate_costs: give at least one profiled batch size.");
  REMAT_CHECK(batch >= 1, "interpolate_costs: the batch size must be at least 1, got ", batch, ".");
  std::vector<std::pair<int64_t, CostTable>> sorted = profiled;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<double> batches;
  for (const auto& [b, table] : sorted) {
    table.check_well_formed("interpolate_costs: the table at batch " + std::to_string(b));
    if (b == batch) return table;
    REMAT_CHECK(b >= 1, "interpolate_costs: profiled batch sizes must be at least 1, got ", b, ".");
    REMAT_CHECK(batches.empty() || batches.back() != static_cast<double>(b), "interpolate_costs: batch size ", b,
                " is profiled twice.");
    batches.push_back(static_cast<double>(b));
  }
  REMAT_CHECK(sorted.size() >= 2, "interpolate_costs: a table at batch ", batch, " needs profiles at two batch ",
              "sizes or more; there is one, at ", profiled.front().first, ".");
  std::vector<const CostTable*> tables;
  for (const auto& entry : sorted) tables.push_back(&entry.second);
  CostTable fitted = interpolate_tables(tables, batches, static_cast<double>(batch));
  std::string sizes;
  for (const auto& entry : sorted) sizes += (sizes.empty() ? "" : ", ") + std::to_string(entry.first);
  fitted.source = "interpolated at batch " + std::to_string(batch) + " from profiles at " + sizes + " (" +
                  sorted.front().second.source + ")";
  return fitted;
}

InterpolationCheck check_interpolation(const std::vector<std::pair<int64_t, CostTable>>& profiled) {
  std::vector<std::pair<int64_t, CostTable>> sorted = profiled;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  InterpolationCheck check;
  for (size_t i = 1; i + 1 < sorted.size(); ++i) {
    std::vector<std::pair<int64_t, CostTable>> others = sorted;
    others.erase(others.begin() + static_cast<std::ptrdiff_t>(i));
    const CostTable& actual = sorted[i].second;
    const CostTable predicted = interpolate_costs(others, sorted[i].first);
    const Prediction a = simulate(actual.unchecked_plan(), actual), p = simulate(predicted.unchecked_plan(), predicted);
    const double peak_error =
        std::abs(static_cast<double>(p.peak_bytes - a.peak_bytes)) / std::max(1.0, static_cast<double>(a.peak_bytes));
    const double step_error = a.step_seconds > 0 ? std::abs(p.step_seconds - a.step_seconds) / a.step_seconds : 0.0;
    if (std::max(peak_error, step_error) >= std::max(check.peak_error, check.step_error)) {
      check.worst_batch = sorted[i].first;
    }
    check.peak_error = std::max(check.peak_error, peak_error);
    check.step_error = std::max(check.step_error, step_error);
  }
  return check;
}

ThroughputChoice plan_throughput(const CostsAtBatch& costs_at, int64_t global_batch, const Budget& budget,
                                 const ThroughputOptions& options) {
  REMAT_CHECK(static_cast<bool>(costs_at),
              "plan_throughput: give the chain's costs at a batch size (profile_batches).");
  REMAT_CHECK(global_batch >= 1, "plan_throughput: the global batch must be at least 1, got ", global_batch, ".");
  std::vector<int64_t> micro_batches =
      options.micro_batches().empty() ? divisors(global_batch) : options.micro_batches();
  std::sort(micro_batches.begin(), micro_batches.end());
  micro_batches.erase(std::unique(micro_batches.begin(), micro_batches.end()), micro_batches.end());
  for (const int64_t m : micro_batches) {
    REMAT_CHECK(m >= 1 && global_batch % m == 0, "plan_throughput: micro-batch ", m, " does not divide the global ",
                "batch ", global_batch, "; equal micro-batches are what make accumulated gradients the global ",
                "batch's. Give divisors of ", global_batch, ".");
  }
  const PlannerOptions& planner = options.planner();
  const CostTable global_costs = costs_at(global_batch);
  global_costs.check_well_formed("plan_throughput: the cost table at batch " + std::to_string(global_batch));
  ThroughputChoice choice;
  choice.global_batch = global_batch;
  choice.unchecked_peak_bytes = simulate(global_costs.unchecked_plan(planner.mode()), global_costs).peak_bytes;
  choice.budget_bytes = budget.to_bytes(choice.unchecked_peak_bytes);
  for (const int64_t m : micro_batches) {
    MicroBatchChoice c;
    c.micro_batch = m;
    c.accumulation = global_batch / m;
    const CostTable costs = m == global_batch ? global_costs : costs_at(m);
    c.planned = plan_optimal(costs, Budget::bytes(choice.budget_bytes), planner);
    const double micro = static_cast<double>(m);
    if (c.planned.feasible && c.planned.prediction.step_seconds > 0) {
      c.predicted_samples_per_second = micro / c.planned.prediction.step_seconds;
    }
    c.unchecked_fits = c.planned.unchecked.peak_bytes <= choice.budget_bytes;
    if (c.unchecked_fits && c.planned.unchecked.step_seconds > 0) {
      c.unchecked_samples_per_second = micro / c.planned.unchecked.step_seconds;
    }
    const size_t index = choice.frontier.size();
    // Ties go to the larger micro-batch: fewer optimizer-free steps, the same samples.
    if (c.predicted_samples_per_second > 0 &&
        (!choice.best ||
         c.predicted_samples_per_second >= choice.frontier[*choice.best].predicted_samples_per_second)) {
      choice.best = index;
    }
    if (c.unchecked_fits) choice.largest_unchecked = index;
    if (m == global_batch && c.planned.feasible) choice.whole_batch = index;
    choice.frontier.push_back(std::move(c));
  }
  return choice;
}

const MicroBatchChoice& ThroughputChoice::chosen() const {
  if (best) return frontier[*best];
  int64_t least = -1;
  int64_t at = 0;
  for (const auto& c : frontier) {
    const int64_t l = c.planned.least_feasible_budget_bytes;
    if (l >= 0 && (least < 0 || l < least)) {
      least = l;
      at = c.micro_batch;
    }
  }
  REMAT_CHECK(least >= 0, "plan_throughput: no micro-batch fits a budget of ", format_bytes(budget_bytes),
              ", and none fits any budget. Plan a smaller model.");
  REMAT_CHECK(false, "plan_throughput: no micro-batch of the global batch ", global_batch, " fits a budget of ",
              budget_bytes, " bytes (", format_bytes(budget_bytes), "): the least that fits is ", least, " bytes (",
              format_bytes(least), ", at micro-batch ", at, "). Give at least that.");
  return frontier.front();
}

std::vector<int64_t> default_profile_batches(int64_t global_batch) {
  REMAT_CHECK(global_batch >= 1, "the global batch must be at least 1, got ", global_batch, ".");
  // The ends of the micro-batches searched (1 and G), so that every one is interpolated, never
  // extrapolated, and the divisor nearest their geometric mean, so that the broken line bends where
  // per-sample cost changes most and check_interpolation has an interior size to test the law on.
  std::vector<int64_t> sizes{global_batch};
  if (global_batch == 1) return sizes;
  const double middle = std::sqrt(static_cast<double>(global_batch));
  int64_t nearest = 1;
  for (const int64_t d : divisors(global_batch)) {
    if (std::abs(std::log(static_cast<double>(d) / middle)) <
        std::abs(std::log(static_cast<double>(nearest) / middle))) {
      nearest = d;
    }
  }
  if (nearest != 1 && nearest != global_batch) sizes.push_back(nearest);
  sizes.push_back(1);
  return sizes;
}

}  // namespace remat
