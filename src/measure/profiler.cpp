#include "remat/measure/profiler.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <memory>
#include <map>
#include <sstream>
#include <tuple>

#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/mul.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include "remat/chain/chain_state.h"
#include "remat/checkpoint/checkpoint.h"
#include "remat/checkpoint/saved_tensors.h"
#include "remat/base/error.h"
#include "remat/base/threads.h"
#include "remat/internal/statistics.h"
#include "remat/memory/memory.h"

namespace remat {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start, c10::Device device) {
  synchronize_device(device);
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t storage_bytes(const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.storage().nbytes()) : 0; }

at::Tensor stage_input(const at::Tensor& activation, bool first) {
  at::Tensor x = activation.detach();
  if (!first && at::isFloatingType(x.scalar_type())) x.requires_grad_(true);
  return x;
}

// How many tensors a stage's forward saves for its backward.
size_t saved_tensor_count(Chain& chain, int64_t i, const at::Tensor& x, const std::string& option) {
  return count_saved_tensors([&] { chain.run_stage(i, x, option); });
}

// Stages with one signature (Chain::stage_signature) and the same sizes: groups of two or more.
std::vector<std::vector<size_t>> twin_groups(const Chain& chain, const CostTable& table) {
  std::map<std::string, std::vector<size_t>> twins;
  for (size_t i = 0; i < table.stages.size(); ++i) {
    const std::string signature = chain.stage_signature(static_cast<int64_t>(i));
    if (signature.empty()) continue;
    const StageCost& s = table.stages[i];
    std::string key = signature + "|" + std::to_string(s.output_bytes) + "|" + std::to_string(s.input_grad_bytes);
    for (const auto& o : s.options) key += "|" + o.option + ":" + std::to_string(o.kept_bytes);
    twins[key].push_back(i);
  }
  std::vector<std::vector<size_t>> groups;
  for (auto& [key, members] : twins) {
    if (members.size() >= 2) groups.push_back(std::move(members));
  }
  return groups;
}

// Twins get one time per measure: the median of their medians.
void pool_twin_stage_times(const Chain& chain, CostTable& table) {
  for (const auto& members : twin_groups(chain, table)) {
    auto pool = [&](auto&& field) {
      std::vector<double> values;
      for (const size_t i : members) values.push_back(field(table.stages[i]));
      const double pooled = median(values);
      for (const size_t i : members) field(table.stages[i]) = pooled;
    };
    pool([](StageCost& s) -> double& { return s.nograd_seconds; });
    for (size_t o = 0; o < table.stages[members.front()].options.size(); ++o) {
      pool([o](StageCost& s) -> double& { return s.options[o].forward_seconds; });
      pool([o](StageCost& s) -> double& { return s.options[o].backward_seconds; });
      pool([o](StageCost& s) -> double& { return s.options[o].graph_only->forward_seconds; });
      pool([o](StageCost& s) -> double& { return s.options[o].graph_only->backward_seconds; });
    }
  }
}

// One measured region: the device synchronised and its peak reset before, then timed.
struct Region {
  double seconds = 0;
  int64_t before_bytes = 0;  // held when it began
  MemoryStats after;         // held and peak when it ended
  int64_t held() const { return after.current_bytes - before_bytes; }
  int64_t transient() const { return after.peak_bytes - after.current_bytes; }
  int64_t peak_above_start() const { return after.peak_bytes - before_bytes; }
};

template <class Body>
Region measure_region(c10::Device device, Body&& body) {
  synchronize_device(device);
  Region region;
  region.before_bytes = memory_stats(device).current_bytes;
  reset_peak_memory(device);
  const auto start = Clock::now();
  body();
  region.seconds = seconds_since(start, device);
  region.after = memory_stats(device);
  return region;
}

// Stage `i`'s forward as a checkpointed segment runs it (recorded, saved tensors dropped): its
// seconds and the bytes it needs beyond its output.
std::pair<double, int64_t> segment_forward(Chain& chain, int64_t i, const at::Tensor& x, c10::Device device) {
  at::Tensor y;
  const Region region = measure_region(
      device, [&] { run_without_saving([&] { y = chain.forward_stage(i, x, chain.stages()[i].options.front()); }); });
  return {region.seconds, region.peak_above_start() - storage_bytes(y)};
}

// What the rounds of measure_stage collect, per option: the plain run [0] and the graph-only run
// [1] (as the last stage of a recompute), each run's bytes the largest seen.
struct StageSamples {
  explicit StageSamples(size_t options) : runs(options), forward(options), backward(options) {}
  std::vector<std::array<StageRunCost, 2>> runs;
  std::vector<std::array<std::vector<double>, 2>> forward, backward;
  std::vector<double> nograd;
  int64_t nograd_extra = 0;
  std::vector<double> totals;  // per round: options[0]'s plain forward + backward
};

// One sample of a graph-only run under the generic early stop: the stage's forward until its last
// saved tensor (`saved` of them); its backward is the plain run's.
void sample_early_stop(Chain& chain, int64_t i, const at::Tensor& x, const std::string& option, size_t saved,
                       c10::Device device, bool keep, StageSamples& samples, size_t o) {
  std::vector<at::Tensor> kept;  // held past the region: what the recompute hands to the backward
  const Region region =
      measure_region(device, [&] { kept = run_until_saved([&] { chain.run_stage(i, x, option); }, saved); });
  if (!keep) return;
  StageRunCost& rc = samples.runs[o][1];
  samples.forward[o][1].push_back(saved > 0 ? region.seconds : 0.0);
  samples.backward[o][1].push_back(samples.backward[o][0].back());
  rc.kept_bytes = std::max(rc.kept_bytes, region.held());
  rc.forward_extra_bytes = std::max(rc.forward_extra_bytes, region.transient());
  rc.backward_extra_bytes = samples.runs[o][0].backward_extra_bytes;
}

// One sample of a recording forward and its backward, plainly or graph-only.
void sample_recorded_run(Chain& chain, int64_t i, const at::Tensor& x, const std::string& option, bool graph_only,
                         c10::Device device, bool keep, StageSamples& samples, size_t o, StageCost& cost) {
  at::Tensor y;
  const Region forward = measure_region(device, [&] { y = chain.run_stage(i, x, option, graph_only); });
  REMAT_CHECK(y.requires_grad(), "profile: stage '", chain.stages()[i].name, "' produced an output that does not ",
              "require grad (no parameters and no floating-point input reach it); merge it into a neighbouring stage.");
  // Backward from δ(i) as a step's backward has it: made by the next stage's backward and owned by
  // the engine, which frees it as soon as this stage's first operation has used it. A product with
  // one stands in for the next stage: its backward makes δ(i) from a broadcast scalar, which holds
  // no memory. Transients are then measured above δ(i).
  const at::Tensor root = at::mul(y, 1.0);
  const at::Tensor seed = at::ones({}, y.options()).expand(y.sizes());
  const Region backward = measure_region(device, [&] { torch::autograd::backward({root}, {seed}); });
  const int64_t input_grad = x.requires_grad() ? storage_bytes(x) : 0;
  const int64_t output_grad = y.numel() * static_cast<int64_t>(y.element_size());  // δ(i)
  if (!keep) return;
  const int kind = graph_only ? 1 : 0;
  StageRunCost& rc = samples.runs[o][kind];
  samples.forward[o][kind].push_back(forward.seconds);
  samples.backward[o][kind].push_back(backward.seconds);
  rc.kept_bytes = std::max(rc.kept_bytes, forward.held());
  rc.forward_extra_bytes = std::max(rc.forward_extra_bytes, forward.transient());
  rc.backward_extra_bytes = std::max(rc.backward_extra_bytes, backward.peak_above_start() - input_grad - output_grad);
  if (!graph_only) {
    cost.output_bytes = storage_bytes(y);
    cost.input_grad_bytes = input_grad;
    if (o == 0) samples.totals.push_back(forward.seconds + backward.seconds);
  }
}

// Rounds go on past `repeats` while the default option's forward + backward scatters more than the
// tolerance allows, up to max_repeats or stage_seconds of extra rounds (ProfileOptions).
class RoundLimit {
 public:
  explicit RoundLimit(const ProfileOptions& options) : options_(options) {}
  // Whether round `r` (negative: warm-up) should not run, given the totals so far.
  bool stop_before(int r, const std::vector<double>& totals) {
    const auto now = Clock::now();
    const double round_seconds = std::chrono::duration<double>(now - round_start_).count();
    round_start_ = now;
    if (r == options_.repeats()) extra_since_ = now;
    if (r < options_.repeats()) return false;
    // One value has no spread: a stage is pinned down by two runs at least.
    const bool pinned = totals.size() >= 2 && median_spread(totals) <= options_.tolerance() * median(totals);
    // Another round would pass the limit: stop before it, not after.
    const bool out_of_time =
        std::chrono::duration<double>(now - extra_since_).count() + round_seconds > options_.stage_seconds();
    return pinned || r >= std::max(options_.repeats(), options_.max_repeats()) || out_of_time;
  }

 private:
  const ProfileOptions& options_;
  Clock::time_point extra_since_{}, round_start_ = Clock::now();
};

// The samples' medians and largest bytes into `cost`.
void summarise_samples(StageSamples& samples, bool generic_stop, StageCost& cost) {
  auto& runs = samples.runs;
  for (size_t o = 0; o < runs.size(); ++o) {
    for (int graph_only = 0; graph_only < 2; ++graph_only) {
      StageRunCost& rc = runs[o][graph_only];
      rc.forward_seconds = median(samples.forward[o][graph_only]);
      rc.backward_seconds = median(samples.backward[o][graph_only]);
      rc.forward_extra_bytes = std::max<int64_t>(rc.forward_extra_bytes, 0);
      rc.backward_extra_bytes = std::max<int64_t>(rc.backward_extra_bytes, 0);
    }
    if (generic_stop) runs[o][1].backward_extra_bytes = runs[o][0].backward_extra_bytes;
    // A graph-only run that keeps what the plain run keeps did the same work (a stage without a
    // graph-only path): it takes the plain run's times rather than a median of its own, whose
    // difference from theirs would be noise the planner reads as a cheaper or dearer recompute.
    if (runs[o][1].kept_bytes == runs[o][0].kept_bytes) {
      runs[o][1].forward_seconds = runs[o][0].forward_seconds;
      runs[o][1].backward_seconds = runs[o][0].backward_seconds;
    }
    static_cast<StageRunCost&>(cost.options[o]) = runs[o][0];
    cost.options[o].graph_only = runs[o][1];
  }
  cost.nograd_seconds = median(samples.nograd);
  cost.nograd_extra_bytes = std::max<int64_t>(samples.nograd_extra, 0);
  cost.spread_seconds = median_spread(samples.totals);
  cost.measured_rounds = static_cast<int>(samples.totals.size());
}

// Times and sizes stage `i` on its real input `activation`, option by option, plainly, graph-only
// (as a segment's last stage) and as a checkpointed segment's forward, into `cost`. Options and the
// segment-style forward are measured in interleaved rounds, so that machine drift (two shared
// cores) moves them alike rather than favouring whichever ran last.
void measure_stage(Chain& chain, int64_t i, const at::Tensor& activation, const ProfileOptions& options,
                   CheckpointMode mode, c10::Device device, StageCost& cost) {
  const std::vector<std::string> names = options.sac_option() ? chain.accepted_options(i) : chain.stages()[i].options;
  cost.options.resize(names.size());
  for (size_t o = 0; o < names.size(); ++o) cost.options[o].option = names[o];
  const bool generic_stop = mode == CheckpointMode::non_reentrant;
  std::vector<size_t> saved_counts(names.size(), 0);
  if (generic_stop) {
    for (size_t o = 0; o < names.size(); ++o) {
      saved_counts[o] = saved_tensor_count(chain, i, stage_input(activation, i == 0), names[o]);
    }
  }
  StageSamples samples(names.size());
  RoundLimit limit(options);
  for (int r = -options.warmup(); !limit.stop_before(r, samples.totals); ++r) {
    const bool keep = r >= 0;
    for (size_t o = 0; o < names.size(); ++o) {
      sample_recorded_run(chain, i, stage_input(activation, i == 0), names[o], false, device, keep, samples, o, cost);
      const at::Tensor x = stage_input(activation, i == 0);
      if (generic_stop) {
        sample_early_stop(chain, i, x, names[o], saved_counts[o], device, keep, samples, o);
      } else {
        sample_recorded_run(chain, i, x, names[o], true, device, keep, samples, o, cost);
      }
    }
    const auto [seconds, extra_bytes] = segment_forward(chain, i, stage_input(activation, i == 0), device);
    if (!keep) continue;
    samples.nograd.push_back(seconds);
    samples.nograd_extra = std::max<int64_t>(samples.nograd_extra, extra_bytes);
  }
  summarise_samples(samples, generic_stop, cost);
}

// One step's forward and backward through `plan`, item by item: each top-level item's forward
// seconds and its share of the backward (from the gradient of its output arriving to that of its
// input leaving, timed by hooks on the items' outputs).
struct ItemTimes {
  std::vector<double> forward, backward;
};

ItemTimes time_step(Chain& chain, const Plan& plan, const at::Tensor& input, c10::Device device) {
  const size_t n = plan.items.size();
  ItemTimes times{std::vector<double>(n), std::vector<double>(n)};
  std::vector<Clock::time_point> arrived(n);
  Clock::time_point item_start;
  PlanItemObserver observer;
  observer.before = [&](size_t) {
    synchronize_device(device);
    item_start = Clock::now();
  };
  observer.after = [&](size_t k, const at::Tensor& output) {
    times.forward[k] = seconds_since(item_start, device);
    if (k + 1 < n && output.requires_grad()) {
      at::Tensor(output).register_hook([&arrived, k, device](const at::Tensor&) {
        synchronize_device(device);
        arrived[k] = Clock::now();
      });
    }
  };
  const at::Tensor a = run_plan_observed(chain, plan, input, observer);
  const at::Tensor seed = at::ones_like(a);
  const auto start = Clock::now();
  torch::autograd::backward({a}, {seed});
  synchronize_device(device);
  const auto end = Clock::now();
  for (size_t k = 0; k < n; ++k) {
    const auto from = k + 1 < n ? arrived[k] : start;
    const auto to = k > 0 ? arrived[k - 1] : end;
    times.backward[k] = std::max(0.0, std::chrono::duration<double>(to - from).count());
  }
  return times;
}

// `plain` with stages [0, n-1) checkpointed in segments of `length` stages (the last one shorter);
// the last stage, where no segment ends, runs plainly.
Plan checkpointed_in_segments(const Plan& plain, int64_t length) {
  Plan plan = plain;
  plan.items.clear();
  const auto n = static_cast<int64_t>(plain.stage_names.size());
  for (int64_t first = 0; first < n - 1; first += length) {
    std::vector<PlanItem> inner;
    for (int64_t i = first; i < std::min(first + length, n - 1); ++i) inner.push_back(PlanItem::run(i));
    plan.items.push_back(PlanItem::checkpointed(std::move(inner)));
  }
  plan.items.push_back(PlanItem::run(n - 1));
  return plan;
}

// A step's times measured round after round, each round running three plans in turn: every stage
// plainly, every stage but the last checkpointed alone ("singles"), and the same in pairs.
struct InStepRounds {
  std::vector<ItemTimes> plain, singles, pairs;
};

double total_seconds(const ItemTimes& times) {
  double total = 0;
  for (size_t k = 0; k < times.forward.size(); ++k) total += times.forward[k] + times.backward[k];
  return total;
}

// Each checkpointed plan's step over the plain step of its round, pinned down within `tolerance`
// (the half-width of a ~95% interval of the median ratio).
bool overheads_pinned(const InStepRounds& rounds, double tolerance) {
  for (const auto* checkpointed : {&rounds.singles, &rounds.pairs}) {
    std::vector<double> ratios;
    for (size_t r = 0; r < rounds.plain.size(); ++r) {
      const double plain = total_seconds(rounds.plain[r]);
      if (plain > 0) ratios.push_back(total_seconds((*checkpointed)[r]) / plain);
    }
    if (ratios.size() < 2 || median_spread(ratios) > tolerance) return false;
  }
  return true;
}

// A shared machine's speed drifts between rounds (a 10 ms step by 15% within minutes), and the
// medians taken over rounds would carry it: each round's times are put on the median round's
// clock, by the ratio of the median plain step to that round's plain step, as paired ratios cancel
// drift in measure_plans.
void normalise_to_the_median_round(InStepRounds& rounds) {
  std::vector<double> plain_totals;
  for (const auto& round : rounds.plain) plain_totals.push_back(total_seconds(round));
  const double typical = median(plain_totals);
  for (size_t r = 0; r < rounds.plain.size(); ++r) {
    if (plain_totals[r] <= 0) continue;
    const double factor = typical / plain_totals[r];
    for (auto* times : {&rounds.plain[r], &rounds.singles[r], &rounds.pairs[r]}) {
      for (double& t : times->forward) t *= factor;
      for (double& t : times->backward) t *= factor;
    }
  }
}

// Short steps get more rounds (up to about a second of them, then more while they scatter): what a
// checkpoint adds to a stage of a tenth of a millisecond is tens of microseconds, which three rounds
// cannot tell from noise. And
// each of their timed steps follows an untimed step of the same plan, as in training: a plan's
// first step after another's pays for the caches that one left (measure_plans does the same).
InStepRounds time_in_step(Chain& chain, const at::Tensor& input, const ProfileOptions& options, CheckpointMode mode,
                          c10::Device device) {
  Plan plain = Plan::unchecked(chain);
  plain.mode = mode;
  const std::vector<Plan> plans = {plain, checkpointed_in_segments(plain, 1), checkpointed_in_segments(plain, 2)};
  constexpr double kRoundsSeconds = 1.0, kShortStepSeconds = 0.05;
  constexpr int kMaxRounds = 41;
  bool warm_each = false;
  InStepRounds rounds;
  int wanted = options.repeats();
  Clock::time_point extra_since{};
  double last_round_seconds = 0;
  for (int r = -std::max(options.warmup(), 1);; ++r) {  // at least one warm-up round: it times a round
    if (r == wanted) extra_since = Clock::now();
    if (r >= wanted) {
      // Past those, rounds go on while what checkpointing adds to the step (each checkpointed
      // plan's step over the plain one's, paired per round) scatters more than half the tolerance,
      // and while another round stays within in_step_seconds.
      const double extra_seconds = std::chrono::duration<double>(Clock::now() - extra_since).count();
      if (r >= std::max(kMaxRounds, wanted) || extra_seconds + last_round_seconds > options.in_step_seconds() ||
          overheads_pinned(rounds, options.tolerance() / 2)) {
        break;
      }
    }
    const auto start = Clock::now();
    std::vector<ItemTimes> times;
    for (const auto& plan : plans) {
      if (warm_each) time_step(chain, plan, input, device);
      times.push_back(time_step(chain, plan, input, device));
    }
    if (r == -1) {  // the last warm-up round: how many rounds a second holds
      const double round_seconds = std::chrono::duration<double>(Clock::now() - start).count();
      warm_each = round_seconds / static_cast<double>(plans.size()) < kShortStepSeconds;
      const double fit = kRoundsSeconds / std::max(round_seconds * (warm_each ? 2 : 1), 1e-9);
      wanted = std::max(options.repeats(), static_cast<int>(std::min<double>(fit, kMaxRounds)));
    }
    last_round_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (r < 0) continue;
    rounds.plain.push_back(std::move(times[0]));
    rounds.singles.push_back(std::move(times[1]));
    rounds.pairs.push_back(std::move(times[2]));
  }
  normalise_to_the_median_round(rounds);
  return rounds;
}

// The median over rounds of an item's times, pooled over its twins (`members`: its group, or it alone).
double pooled_median(const std::vector<ItemTimes>& rounds, std::vector<double> ItemTimes::*times,
                     const std::vector<size_t>& members) {
  std::vector<double> values;
  for (const size_t k : members) {
    std::vector<double> of_k;
    for (const auto& round : rounds) of_k.push_back((round.*times)[k]);
    values.push_back(median(of_k));
  }
  return median(values);
}

// What a checkpointed segment costs by itself within a step, from the rounds' singles and pairs:
// a pair's segment is paid once where its two singles pay it twice, and otherwise runs what they
// run, except that its first stage is recomputed fully rather than graph-only. `full_minus_end[i]`
// is stage i's full forward and backward minus its graph-only ones (0 for the forward side).
// Returns the median over rounds of the mean over pairs where the rounds pin it down to within
// `fallback` (the fixed cost measured on a trivial function, outside a step: twice the standard
// error at most); else, with stages whose noise exceeds a segment's cost, `fallback`. `spread`: the
// half-width of the estimate's interval.
double segment_seconds_in_step(const InStepRounds& rounds, std::vector<double> ItemTimes::*times,
                               const std::vector<double>& full_minus_end, double fallback, double& spread) {
  spread = 0;
  std::vector<double> per_round;
  for (size_t r = 0; r < rounds.singles.size(); ++r) {
    const std::vector<double>& singles = rounds.singles[r].*times;
    const std::vector<double>& pairs = rounds.pairs[r].*times;
    double sum = 0;
    size_t count = 0;
    for (size_t p = 0; 2 * p + 1 < singles.size() - 1; ++p) {  // pair p: stages 2p, 2p+1 (the last item is plain)
      sum += singles[2 * p] + singles[2 * p + 1] - pairs[p] + full_minus_end[2 * p];
      ++count;
    }
    if (count == 0) return fallback;
    per_round.push_back(sum / static_cast<double>(count));
  }
  const double estimate = median(per_round);
  spread = median_spread(per_round);
  if (spread <= fallback) return std::max(0.0, estimate);
  spread = fallback;  // the fallback is measured apart, on many pairs: known to about itself
  return fallback;
}

// The relative spread over rounds of an item's forward + backward (its twins' rounds pooled).
double relative_spread_in_step(const std::vector<ItemTimes>& rounds, const std::vector<size_t>& members) {
  std::vector<double> values;
  for (const size_t k : members) {
    for (const auto& round : rounds) {
      if (k < round.forward.size()) values.push_back(round.forward[k] + round.backward[k]);
    }
  }
  const double centre = median(values);
  return centre > 0 ? median_spread(values) / centre : 0.0;
}

// A stage timed alone pays per call what a step pays once (an autograd run of its own, the thread
// pool waking, the clocks and counters around it): where a stage takes a tenth of a millisecond,
// most of its measured time. Each stage's times are scaled to its time within a whole step (twins
// pooled), so that options and graph-only runs keep their measured proportions and a plan's
// predicted step adds up to the step measured. Then what checkpointing costs is read off the steps
// with stages checkpointed alone and in pairs: the segment's own cost (segment_seconds_in_step),
// and per stage its forward inside a segment (nograd_seconds) and what its recompute takes beyond
// its graph-only forward and backward (recompute_extra_seconds, never below 0: noise must not make
// a recompute look cheaper than the forward it repeats).
void scale_to_step_times(Chain& chain, const at::Tensor& input, const ProfileOptions& options, CheckpointMode mode,
                         c10::Device device, CostTable& table) {
  const InStepRounds rounds = time_in_step(chain, input, options, mode, device);
  const size_t n = table.stages.size();
  std::vector<std::vector<size_t>> twins(n);
  for (size_t i = 0; i < n; ++i) twins[i] = {i};
  for (const auto& members : twin_groups(chain, table)) {
    for (const size_t i : members) twins[i] = members;
  }
  std::vector<double> full_minus_end(n, 0.0), no_correction(n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    StageCost& stage = table.stages[i];
    const StageOptionCost& measured_default = stage.options.front();
    auto ratio = [](double step, double alone) { return alone > 0 ? step / alone : 1.0; };
    const double forward_ratio =
        ratio(pooled_median(rounds.plain, &ItemTimes::forward, twins[i]), measured_default.forward_seconds);
    const double backward_ratio =
        ratio(pooled_median(rounds.plain, &ItemTimes::backward, twins[i]), measured_default.backward_seconds);
    // The stage's spread: its runs alone, scaled as its times are, and its in-step rounds (the
    // step with it checkpointed by itself, whose times the recompute's costs come from), combined.
    const double alone_seconds = measured_default.forward_seconds + measured_default.backward_seconds;
    const double relative_alone = alone_seconds > 0 ? stage.spread_seconds / alone_seconds : 0.0;
    const double relative_in_step = relative_spread_in_step(rounds.singles, twins[i]);
    stage.nograd_seconds *= forward_ratio;
    for (auto& o : stage.options) {
      for (StageRunCost* run : {static_cast<StageRunCost*>(&o), o.graph_only ? &*o.graph_only : nullptr}) {
        if (run == nullptr) continue;
        run->forward_seconds *= forward_ratio;
        run->backward_seconds *= backward_ratio;
      }
    }
    const StageOptionCost& o = stage.options.front();
    stage.spread_seconds = std::hypot(relative_alone, relative_in_step) * (o.forward_seconds + o.backward_seconds);
    full_minus_end[i] = o.forward_seconds + o.backward_seconds - o.at_segment_end().forward_seconds -
                        o.at_segment_end().backward_seconds;
  }
  double forward_spread = 0, backward_spread = 0;
  table.segment_forward_seconds = segment_seconds_in_step(rounds, &ItemTimes::forward, no_correction,
                                                          table.segment_forward_seconds, forward_spread);
  table.segment_backward_seconds = segment_seconds_in_step(rounds, &ItemTimes::backward, full_minus_end,
                                                           table.segment_backward_seconds, backward_spread);
  table.segment_spread_seconds = std::hypot(forward_spread, backward_spread);
  for (size_t i = 0; i + 1 < n; ++i) {  // the last stage ends no segment: never checkpointed
    StageCost& stage = table.stages[i];
    const StageRunCost& end = stage.options.front().at_segment_end();
    stage.nograd_seconds =
        std::max(0.0, pooled_median(rounds.singles, &ItemTimes::forward, twins[i]) - table.segment_forward_seconds);
    stage.recompute_extra_seconds =
        std::max(0.0, pooled_median(rounds.singles, &ItemTimes::backward, twins[i]) - table.segment_backward_seconds -
                          end.forward_seconds - end.backward_seconds);
  }
}

// What a checkpointed segment costs by itself in `mode`: a checkpoint of a one-element product
// against the product run plainly, forward and backward apart (medians of many pairs: each is
// microseconds).
std::pair<double, double> segment_fixed_seconds(const at::Tensor& like, CheckpointMode mode, c10::Device device) {
  constexpr int kWarmup = 5, kPairs = 41;
  const auto square = [](const at::Tensor& x) { return at::mul(x, x); };
  std::vector<double> forward_extra, backward_extra;
  for (int r = -kWarmup; r < kPairs; ++r) {
    std::array<double, 2> forward{}, backward{};
    for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
      at::Tensor x = at::ones({}, like.options().dtype(at::kFloat)).requires_grad_(true);
      synchronize_device(device);
      auto start = Clock::now();
      at::Tensor y = checkpointed ? checkpoint(square, x, CheckpointOptions().mode(mode)) : square(x);
      forward[checkpointed] = seconds_since(start, device);
      start = Clock::now();
      y.backward();
      backward[checkpointed] = seconds_since(start, device);
    }
    if (r < 0) continue;
    forward_extra.push_back(forward[1] - forward[0]);
    backward_extra.push_back(backward[1] - backward[0]);
  }
  return {std::max(0.0, median(forward_extra)), std::max(0.0, median(backward_extra))};
}

void check_profile_options(const ProfileOptions& options) {
  REMAT_CHECK(options.repeats() >= 1 && options.warmup() >= 0, "profile: repeats must be >= 1 and warmup >= 0.");
  REMAT_CHECK(options.tolerance() > 0 && std::isfinite(options.tolerance()) && options.stage_seconds() >= 0 &&
                  std::isfinite(options.stage_seconds()) && options.in_step_seconds() >= 0 &&
                  std::isfinite(options.in_step_seconds()),
              "profile: tolerance must be a positive fraction (0.05: 5%), stage_seconds and in_step_seconds finite ",
              "and >= 0; got ", options.tolerance(), ", ", options.stage_seconds(), " and ", options.in_step_seconds(),
              ".");
}

// Every stage's real input: the chain run once without recording (result[i] is stage i's input).
std::vector<at::Tensor> stage_inputs(Chain& chain, const at::Tensor& input) {
  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> activations;
  at::Tensor a = input;
  for (int64_t i = 0; i < chain.size(); ++i) {
    activations.push_back(a);
    a = chain.forward_stage(i, a, chain.stages()[i].options.front());
  }
  return activations;
}

// What one checkpointed segment holds beyond its tensors (its RNG state).
int64_t segment_held_bytes(const at::Tensor& input, c10::Device device) {
  at::Tensor probe = at::ones({1}, input.options().dtype(at::kFloat)).requires_grad_(true);
  synchronize_device(device);
  const int64_t before = memory_stats(device).current_bytes;
  at::Tensor y = checkpoint([](const at::Tensor& x) { return at::mul(x, x); }, probe,
                            CheckpointOptions().mode(CheckpointMode::reentrant));
  return std::max<int64_t>(0, memory_stats(device).current_bytes - before - storage_bytes(y));
}

// Each stage measured alone into table.stages. Twins (one signature, inputs of one shape) beyond
// the first few are not timed again: they take the pooled costs of those (a stack of 300 identical
// layers times 4 of them, not 300).
void measure_stages(Chain& chain, const std::vector<at::Tensor>& activations, const ProfileOptions& options,
                    CheckpointMode mode, c10::Device device, CostTable& table) {
  constexpr size_t kTimedTwins = 4;
  std::map<std::string, std::vector<int64_t>> timed_twins;
  std::vector<std::pair<int64_t, int64_t>> copies;  // (stage, the twin it takes its costs from)
  for (int64_t i = 0; i < chain.size(); ++i) {
    const StageInfo& info = chain.stages()[i];
    StageCost cost;
    cost.name = info.name;
    cost.block = info.block;
    for (const auto& p : chain.stage_parameters(i)) cost.parameter_bytes += storage_bytes(p);
    const std::string signature = chain.stage_signature(i);
    if (!signature.empty()) {
      std::ostringstream key;
      key << signature << "|" << activations[i].sizes() << "|" << activations[i].dtype() << "|" << (i == 0);
      auto& timed = timed_twins[key.str()];
      if (timed.size() >= kTimedTwins) {
        copies.emplace_back(i, timed.front());
        table.stages.push_back(std::move(cost));
        continue;
      }
      timed.push_back(i);
    }
    measure_stage(chain, i, activations[i], options, mode, device, cost);
    table.stages.push_back(std::move(cost));
  }
  pool_twin_stage_times(chain, table);
  for (const auto& [stage, twin] : copies) {
    StageCost cost = table.stages[static_cast<size_t>(twin)];
    cost.name = table.stages[static_cast<size_t>(stage)].name;
    cost.block = table.stages[static_cast<size_t>(stage)].block;
    cost.parameter_bytes = table.stages[static_cast<size_t>(stage)].parameter_bytes;
    cost.measured_rounds = 0;  // its twin's runs, not its own
    table.stages[static_cast<size_t>(stage)] = std::move(cost);
  }
}

// "; 2 stages not within 5% (e.g. 'head'): ..." where the profile could not pin stages down.
std::string unstable_note(const CostTable& table, double tolerance) {
  const std::vector<std::string> unstable = table.unstable_stages(tolerance);
  if (unstable.empty()) return {};
  return "; " + std::to_string(unstable.size()) + " stage" + (unstable.size() == 1 ? "" : "s") + " not within " +
         std::to_string(static_cast<int>(std::lround(tolerance * 100))) + "% (e.g. '" + unstable.front() +
         "'): their spread widens the predictions";
}

}  // namespace

CostTable profile_chain(Chain& chain, const at::Tensor& input, const ProfileOptions& options, CheckpointMode mode) {
  warn_if_threads_oversubscribed();  // timed around below, but the user's training runs as found
  check_profile_options(options);
  REMAT_CHECK(input.defined(), "profile: the sample input is undefined.");
  REMAT_CHECK(c10::GradMode::is_enabled(), "profile: grad mode is disabled; profile outside torch::NoGradGuard.");
  const c10::Device device = input.device();
  if (device.is_cpu()) install_cpu_memory_tracker();
  // Profiling runs every stage many times: the model's gradients, running statistics and the RNG
  // streams are put back afterwards, so planning leaves training exactly as it was.
  const ChainStateGuard untouched(chain, input);
  const TimingThreads threads(options.threads());

  CostTable table;
  table.granularity = chain.granularity();
  table.segment_bytes = segment_held_bytes(input, device);
  table.source = "profiled on " + device.str() + ": medians of " + std::to_string(options.repeats()) + " to " +
                 std::to_string(std::max(options.repeats(), options.max_repeats())) + " runs" +
                 (mode == CheckpointMode::non_reentrant ? ", segment ends: non-reentrant early stop" : "");
  table.threads = threads.description();
  measure_stages(chain, stage_inputs(chain, input), options, mode, device, table);
  std::tie(table.segment_forward_seconds, table.segment_backward_seconds) = segment_fixed_seconds(input, mode, device);
  scale_to_step_times(chain, input, options, mode, device, table);
  table.source += unstable_note(table, options.tolerance());
  return table;
}

}  // namespace remat
