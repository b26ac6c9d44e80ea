#include "remat/planner.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "remat/error.h"

namespace remat {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

int64_t round_up(int64_t bytes, int64_t unit) { return (bytes + unit - 1) / unit; }

// Stage costs in memory units, option by option (rounded up: feasible in units => fits in bytes).
struct UnitStage {
  int64_t x = 0, input_grad = 0, nograd_extra = 0, parameters = 0;
  double nograd_seconds = 0;
  struct Option {
    int64_t kept, forward_extra, backward_extra;
    double seconds;
  };
  std::vector<Option> options;
  std::vector<Option> end_options;  ///< the same options where the stage ends a recomputed segment
};

std::vector<UnitStage> to_units(const CostTable& costs, int64_t unit) {
  std::vector<UnitStage> out;
  for (const auto& s : costs.stages) {
    UnitStage u;
    u.x = round_up(s.output_bytes, unit);
    u.input_grad = round_up(s.input_grad_bytes, unit);
    u.nograd_extra = round_up(s.nograd_extra_bytes, unit);
    u.parameters = round_up(s.parameter_bytes, unit);
    u.nograd_seconds = s.nograd_seconds;
    auto units = [unit](const StageRunCost& c) {
      return UnitStage::Option{round_up(c.kept_bytes, unit), round_up(c.forward_extra_bytes, unit),
                               round_up(c.backward_extra_bytes, unit), c.forward_seconds + c.backward_seconds};
    };
    for (const auto& o : s.options) {
      u.options.push_back(units(o));
      u.end_options.push_back(units(o.at_segment_end()));
    }
    out.push_back(u);
  }
  return out;
}

}  // namespace

size_t OptimalPlanner::index(int64_t s, int64_t t, int64_t m) const {
  // Row s holds the ranges s..s+L-1 that fit inside a segment, then s..n-1 (the top level's rest).
  const int64_t slot = t - s < max_segment_ ? t - s : max_segment_;
  return (row_offset_[s] + static_cast<size_t>(slot)) * static_cast<size_t>(slots_ + 1) + static_cast<size_t>(m);
}

namespace {

// Bounds on the table (12 bytes an entry) and on the slot updates filling it: about a second a
// billion updates here, so a plan takes seconds and a GiB at most, whatever the chain's length.
constexpr double kMaxTableEntries = (1 << 30) / 12.0;
constexpr double kMaxSlotUpdates = 3e9;

struct TableSize {
  double entries = 0, updates = 0;
};

// Ranges inside a segment of at most `longest` stages, plus each stage's range to the end of the chain.
TableSize table_size(int64_t n, int64_t longest, int64_t slots, int64_t options) {
  TableSize size;
  const double row = static_cast<double>(slots + 1);
  for (int64_t length = 1; length <= std::min(longest, n); ++length) {
    const double ranges = static_cast<double>(n - length + 1);
    size.entries += ranges * row;
    size.updates += ranges * row * static_cast<double>(options + length - 1);
  }
  const double longer = static_cast<double>(std::max<int64_t>(0, n - longest));
  size.entries += longer * row;
  size.updates += longer * row * static_cast<double>(options + longest);
  return size;
}

// A segment nested inside another is at most this many stages long: all of them on chains the
// bounds allow (the exact optimum), fewer on long ones (the optimum among such plans).
int64_t longest_segment_within_bounds(int64_t n, int64_t slots, int64_t options) {
  auto fits = [&](int64_t longest) {
    const TableSize size = table_size(n, longest, slots, options);
    return size.entries <= kMaxTableEntries && size.updates <= kMaxSlotUpdates;
  };
  REMAT_CHECK(fits(1), "planner: a chain of ", n, " stages with ", slots, " memory slots needs a table of ",
              table_size(n, 1, slots, options).entries, " entries or more (at most ", kMaxTableEntries,
              "); plan fewer stages (a coarser granularity) or with fewer memory slots.");
  // Nesting needs a stage per level: segments longer than a plan may nest would be wasted.
  int64_t fitting = 1, too_long = std::min<int64_t>(n, Plan::kMaxNesting) + 1;  // by bisection
  while (too_long - fitting > 1) {
    const int64_t mid = fitting + (too_long - fitting) / 2;
    (fits(mid) ? fitting : too_long) = mid;
  }
  return fitting;
}

}  // namespace

int64_t OptimalPlanner::captured_units(int64_t first, int64_t t) const {
  if (template_.mode == CheckpointMode::non_reentrant) return 0;  // gradients go to .grad as they come
  return t < n_ - 1 && first <= t ? parameter_units_before_[t + 1] - parameter_units_before_[first] : 0;
}

double OptimalPlanner::cost(int64_t s, int64_t t, int64_t m) const {
  if (m < 0) return kInfinity;
  return table_[index(s, t, std::min(m, slots_))];
}

OptimalPlanner::OptimalPlanner(CostTable costs, Plan plan_template, int64_t memory_slots, int64_t max_budget_bytes)
    : costs_(std::move(costs)), template_(std::move(plan_template)) {
  const auto start = std::chrono::steady_clock::now();
  n_ = static_cast<int64_t>(costs_.stages.size());
  REMAT_CHECK(n_ >= 1 && static_cast<int64_t>(template_.stage_names.size()) == n_, "planner: the cost table has ", n_,
              " stages but the chain ", template_.stage_names.size(), ".");
  REMAT_CHECK(memory_slots >= 1 && memory_slots <= 100000, "planner: memory_slots must be in [1, 100000], got ",
              memory_slots, ".");
  if (max_budget_bytes <= 0) {
    Plan none = template_;
    for (int64_t i = 0; i < n_; ++i) none.options[i] = costs_.stages[i].options.front().option;
    // Twice the unchecked peak: with sizes rounded up to units, the unchecked plan itself needs
    // headroom to stay feasible.
    max_budget_bytes = 2 * std::max<int64_t>(simulate(none, costs_).peak_bytes, 1);
  }
  slots_ = memory_slots;
  unit_ = std::max<int64_t>(1, round_up(max_budget_bytes, slots_));
  const auto stages = to_units(costs_, unit_);
  const int64_t segment_units = round_up(costs_.segment_bytes, unit_);
  for (const auto& s : stages) max_options_ = std::max<int32_t>(max_options_, static_cast<int32_t>(s.options.size()));

  max_segment_ = longest_segment_within_bounds(n_, slots_, max_options_);
  row_offset_.assign(n_ + 1, 0);
  for (int64_t s = 0; s < n_; ++s) {
    const int64_t inside = std::min(max_segment_, n_ - s);
    row_offset_[s + 1] = row_offset_[s] + static_cast<size_t>(inside + (n_ - 1 - s >= max_segment_ ? 1 : 0));
  }
  const size_t total = row_offset_[n_] * static_cast<size_t>(slots_ + 1);
  table_.assign(total, kInfinity);
  choice_.assign(total, -1);
  // Subproblems that end before the last stage are the inside of a checkpointed segment (a segment
  // never ends at the end of its range, and the top level's rest always ends at n-1): there the
  // parameter gradients of stages already back-propagated are held until the segment returns.
  parameter_units_before_.assign(n_ + 1, 0);
  for (int64_t k = 0; k < n_; ++k) parameter_units_before_[k + 1] = parameter_units_before_[k] + stages[k].parameters;

  // Loops run over the memory slots innermost: for a fixed choice the recurrence reads contiguous
  // rows of the table, which the compiler vectorises. Ties keep the earlier choice (options first,
  // then segment ends in increasing order), as a scalar loop would.
  for (int64_t length = 1; length <= n_; ++length) {
    for (int64_t s = 0; s + length - 1 < n_; ++s) {
      const int64_t t = s + length - 1;
      if (length > max_segment_ && t != n_ - 1) continue;  // longer than a nested segment may be
      const UnitStage& first = stages[s];
      const int64_t grad_t = stages[t].x;
      double* row = &table_[index(s, t, 0)];
      int32_t* chosen = &choice_[index(s, t, 0)];
      // Record stage s with each of its options. A range that ends before the last stage is the
      // inside of a segment, whose last stage (s == t) its recompute runs graph-only.
      const bool segment_end = s == t && t < n_ - 1;
      for (size_t o = 0; o < first.options.size(); ++o) {
        const auto& opt = segment_end ? first.end_options[o] : first.options[o];
        const int64_t lowest = std::max(grad_t + opt.kept + opt.forward_extra,
                                        first.x + opt.kept + first.input_grad + opt.backward_extra +
                                            captured_units(s + 1, t));
        if (s == t) {
          for (int64_t m = lowest; m <= slots_; ++m) {
            if (opt.seconds < row[m]) {
              row[m] = opt.seconds;
              chosen[m] = static_cast<int32_t>(o);
            }
          }
          continue;
        }
        const double* rest = &table_[index(s + 1, t, 0)];
        for (int64_t m = std::max(lowest, opt.kept); m <= slots_; ++m) {
          const double total_seconds = opt.seconds + rest[m - opt.kept];
          if (total_seconds < row[m]) {
            row[m] = total_seconds;
            chosen[m] = static_cast<int32_t>(o);
          }
        }
      }
      // Checkpoint stages s..j-1 (a segment never ends at t: that would only add a forward).
      double forward_seconds = 0;
      int64_t forward_peak = 0;
      for (int64_t j = s + 1; j <= std::min(t, s + max_segment_); ++j) {
        const int64_t k = j - 1;  // the stage the segment's no-grad forward now also runs
        const int64_t held_input = k == s ? 0 : stages[k - 1].x;
        forward_peak = std::max(forward_peak, segment_units + grad_t + held_input + stages[k].x + stages[k].nograd_extra);
        forward_seconds += stages[k].nograd_seconds;
        const int64_t x = stages[k].x;
        const int64_t held_in_backward = 2 * segment_units + captured_units(j, t);
        const int64_t lowest = std::max(forward_peak, std::max(x + segment_units, held_in_backward));
        if (lowest > slots_) break;  // the forward's peak only grows with j
        const double* rest = &table_[index(j, t, 0)];
        const double* inner = &table_[index(s, k, 0)];
        const auto segment_choice = max_options_ + static_cast<int32_t>(j);
        for (int64_t m = lowest; m <= slots_; ++m) {
          const double total_seconds = forward_seconds + rest[m - x - segment_units] + inner[m - held_in_backward];
          if (total_seconds < row[m]) {
            row[m] = total_seconds;
            chosen[m] = segment_choice;
          }
        }
      }
    }
  }
  find_least_memory_plan();
  fill_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The first slot where the whole chain is feasible (the table is monotone in m), and its plan's peak.
void OptimalPlanner::find_least_memory_plan() {
  for (int64_t m = 0; m <= slots_ && min_units_ < 0; ++m) {
    if (table_[index(0, n_ - 1, m)] < kInfinity) min_units_ = m;
  }
  if (min_units_ >= 0) {
    Plan plan = template_;
    plan.items.clear();
    build(0, n_ - 1, min_units_, plan.items, plan);
    min_feasible_bytes_ = simulate(plan, costs_).peak_bytes;
  } else {
    min_feasible_bytes_ = -1;
  }
}

void OptimalPlanner::build(int64_t s, int64_t t, int64_t m, std::vector<PlanItem>& items, Plan& plan) const {
  // Along the range in a loop; only a segment's inside recurses (depth: the nesting, at most
  // max_segment_ levels).
  const int64_t segment_units = round_up(costs_.segment_bytes, unit_);
  while (true) {
    m = std::min(m, slots_);
    const int32_t choice = choice_[index(s, t, m)];
    TORCH_INTERNAL_ASSERT(choice >= 0, "planner: backtracking reached an infeasible state");
    if (choice < max_options_) {
      plan.options[s] = costs_.stages[s].options[choice].option;
      items.push_back(PlanItem::run(s));
      if (s == t) return;
      m -= round_up(costs_.stages[s].options[choice].kept_bytes, unit_);
      ++s;
      continue;
    }
    const int64_t j = choice - max_options_;
    std::vector<PlanItem> inner;
    build(s, j - 1, m - 2 * segment_units - captured_units(j, t), inner, plan);
    items.push_back(PlanItem::checkpointed(std::move(inner)));
    m -= segment_units + round_up(costs_.stages[j - 1].output_bytes, unit_);
    s = j;
  }
}

double OptimalPlanner::least_seconds(int64_t budget_bytes) const {
  return budget_bytes < 0 ? kInfinity : cost(0, n_ - 1, budget_bytes / unit_);
}

PlanResult OptimalPlanner::plan(int64_t budget_bytes) const {
  const auto start = std::chrono::steady_clock::now();
  PlanResult result;
  result.budget_bytes = budget_bytes;
  result.min_feasible_budget_bytes = min_feasible_bytes_;
  // Sizes round up, so the budget's row holds a plan that fits; on a chain of many small stages the
  // rounding adds up, and rows above the budget's may hold faster plans that still fit in bytes:
  // step up by the slack the simulator finds while they do.
  // The least-memory row's plan fits any budget of at least its peak, whatever the rounding.
  int64_t first = budget_bytes < 0 ? -1 : std::min<int64_t>(budget_bytes / unit_, slots_);
  if (min_units_ >= 0 && first < min_units_ && budget_bytes >= min_feasible_bytes_) first = min_units_;
  for (int64_t m = first; m >= 0 && m <= slots_;) {
    if (table_[index(0, n_ - 1, m)] == kInfinity) break;
    Plan plan = template_;
    plan.items.clear();
    build(0, n_ - 1, m, plan.items, plan);
    const Prediction prediction = simulate(plan, costs_);
    if (prediction.peak_bytes > budget_bytes) break;
    if (!result.feasible || prediction.step_seconds < result.prediction.step_seconds) {
      result.feasible = true;
      result.plan = std::move(plan);
      result.prediction = prediction;
    }
    if (m == slots_) break;
    m += std::max<int64_t>(1, (budget_bytes - prediction.peak_bytes) / unit_);
  }
  result.solve_seconds = fill_seconds_ + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

PlanResult revolve_plan(const CostTable& costs, const Plan& plan_template, int64_t budget_bytes, int64_t memory_slots) {
  // The homogeneous model Revolve assumes: every block stage costs the mean block stage (first
  // and last stages keep their own costs; they are not part of the repeated chain).
  CostTable uniform = costs;
  const auto n = static_cast<int64_t>(costs.stages.size());
  if (n > 2) {
    StageCost mean = costs.stages[1];
    const double count = static_cast<double>(n - 2);
    auto average = [&](auto getter) {
      double sum = 0;
      for (int64_t i = 1; i < n - 1; ++i) sum += static_cast<double>(getter(costs.stages[i]));
      return sum / count;
    };
    mean.output_bytes = static_cast<int64_t>(std::ceil(average([](const StageCost& s) { return s.output_bytes; })));
    mean.input_grad_bytes = static_cast<int64_t>(std::ceil(average([](const StageCost& s) { return s.input_grad_bytes; })));
    mean.nograd_seconds = average([](const StageCost& s) { return s.nograd_seconds; });
    mean.nograd_extra_bytes = static_cast<int64_t>(std::ceil(average([](const StageCost& s) { return s.nograd_extra_bytes; })));
    StageOptionCost o = costs.stages[1].options.front();
    o.forward_seconds = average([](const StageCost& s) { return s.options.front().forward_seconds; });
    o.backward_seconds = average([](const StageCost& s) { return s.options.front().backward_seconds; });
    o.kept_bytes = static_cast<int64_t>(std::ceil(average([](const StageCost& s) { return s.options.front().kept_bytes; })));
    o.forward_extra_bytes = static_cast<int64_t>(std::ceil(average([](const StageCost& s) { return s.options.front().forward_extra_bytes; })));
    o.backward_extra_bytes = static_cast<int64_t>(std::ceil(average([](const StageCost& s) { return s.options.front().backward_extra_bytes; })));
    mean.options = {o};  // Revolve knows no stage options
    for (int64_t i = 1; i < n - 1; ++i) {
      const std::string name = uniform.stages[i].name;
      uniform.stages[i] = mean;
      uniform.stages[i].name = name;
    }
  }
  for (auto& s : uniform.stages) s.options.resize(1);
  Plan base = plan_template;
  for (int64_t i = 0; i < n; ++i) base.options[i] = costs.stages[i].options.front().option;
  OptimalPlanner planner(uniform, base, memory_slots, std::max<int64_t>(budget_bytes, 1));
  PlanResult result = planner.plan(budget_bytes);
  if (result.feasible) {
    result.prediction = simulate(result.plan, costs);  // costed on the real chain: it may not fit
    result.feasible = result.prediction.peak_bytes <= budget_bytes;
  }
  return result;
}

PlanResult chen_greedy_plan(const CostTable& costs, const Plan& plan_template, int64_t budget_bytes) {
  const auto start = std::chrono::steady_clock::now();
  const auto n = static_cast<int64_t>(costs.stages.size());
  PlanResult best;
  best.budget_bytes = budget_bytes;
  std::vector<int64_t> thresholds;
  for (int64_t a = 1; a < n - 1; ++a) {  // candidate thresholds: kept bytes of every run of block stages
    int64_t sum = 0;
    for (int64_t b = a; b < n - 1; ++b) {
      sum += costs.stages[b].options.front().kept_bytes;
      thresholds.push_back(sum);
    }
  }
  std::sort(thresholds.begin(), thresholds.end());
  thresholds.erase(std::unique(thresholds.begin(), thresholds.end()), thresholds.end());
  int64_t least_peak = -1;
  for (int64_t threshold : thresholds) {
    // First and last stages (input, loss) run plainly; block stages are grouped greedily.
    Plan plan = plan_template;
    for (int64_t i = 0; i < n; ++i) plan.options[i] = costs.stages[i].options.front().option;
    plan.items = {PlanItem::run(0)};
    std::vector<PlanItem> segment;
    int64_t running = 0;
    for (int64_t i = 1; i < n - 1; ++i) {
      const int64_t kept = costs.stages[i].options.front().kept_bytes;
      if (!segment.empty() && running + kept > threshold) {
        plan.items.push_back(PlanItem::checkpointed(std::move(segment)));
        segment.clear();
        running = 0;
      }
      segment.push_back(PlanItem::run(i));
      running += kept;
    }
    if (!segment.empty()) plan.items.push_back(PlanItem::checkpointed(std::move(segment)));
    if (n > 1) plan.items.push_back(PlanItem::run(n - 1));
    const Prediction p = simulate(plan, costs);
    if (least_peak < 0 || p.peak_bytes < least_peak) least_peak = p.peak_bytes;
    if (p.peak_bytes <= budget_bytes && (!best.feasible || p.step_seconds < best.prediction.step_seconds)) {
      best.feasible = true;
      best.plan = plan;
      best.prediction = p;
    }
  }
  best.min_feasible_budget_bytes = least_peak;
  best.solve_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return best;
}

int64_t parse_budget(const std::string& text, int64_t unchecked_peak_bytes) {
  const std::string hint = "; write it as bytes (123456 or 123456B), with a unit (800KiB, 512MiB, 1.5GiB) or as a "
                           "percentage of the unchecked activation peak (50%).";
  REMAT_CHECK(!text.empty(), "the budget is empty", hint);
  const std::string echoed = text.size() > 40 ? text.substr(0, 37) + "..." : text;  // it may be 100,000 digits
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::out_of_range&) {
    REMAT_CHECK(false, "budget '", echoed, "' is out of range", hint);
  } catch (const std::exception&) {
    REMAT_CHECK(false, "budget '", echoed, "' does not start with a number", hint);
  }
  REMAT_CHECK(std::isfinite(value), "budget '", echoed, "' is not a finite number", hint);
  const std::string unit = text.substr(used);
  double bytes = 0;
  if (unit == "%") {
    REMAT_CHECK(value > 0 && value <= 1000, "budget '", echoed, "': a percentage must be in (0, 1000].");
    bytes = value / 100.0 * static_cast<double>(unchecked_peak_bytes);
  } else if (unit.empty() || unit == "B") {
    bytes = value;
  } else if (unit == "KiB" || unit == "K") {
    bytes = value * 1024.0;
  } else if (unit == "MiB" || unit == "M") {
    bytes = value * 1024.0 * 1024.0;
  } else if (unit == "GiB" || unit == "G") {
    bytes = value * 1024.0 * 1024.0 * 1024.0;
  } else {
    REMAT_CHECK(false, "budget '", echoed, "' has an unknown unit '", unit.size() > 20 ? unit.substr(0, 17) + "..." : unit, "'", hint);
  }
  REMAT_CHECK(bytes >= 0 && bytes < 9.0e18, "budget '", echoed, "' is out of range", hint);
  return static_cast<int64_t>(bytes);
}

}  // namespace remat
