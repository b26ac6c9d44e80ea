#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "base/tensor_text.h"
#include "graph/recorded_step.h"
#include "remat/base/error.h"

namespace remat::detail {
namespace {

size_t at(int64_t index) { return static_cast<size_t>(index); }

// Up to this many candidates, every subset is simulated (2 x 2^13 walks, well under a second on small steps).
constexpr size_t kExactCandidates = 13;

// A value the runtime holds for replays: the newest value of a kept storage autograd saved.
bool available(const RecordedStep& step, const StepDrops& drops, int64_t value) {
  const int64_t s = step.values[at(value)].storage;
  const RecordedStorage& storage = step.storages[at(s)];
  return !storage.outside && !drops.dropped[at(s)] && !storage.saved.empty() && storage.last_value == value;
}

}  // namespace

Rebuilds rebuilds_of(const RecordedStep& step, const StepDrops& drops) {
  Rebuilds out;
  out.calls_of.resize(step.saved.size());
  out.sources_of.resize(step.saved.size());
  out.replayed.assign(step.calls.size(), false);
  out.source.assign(step.values.size(), false);
  std::vector<int64_t> pending;
  std::unordered_set<int64_t> seen_values;
  std::unordered_set<int64_t> seen_calls;
  for (size_t e = 0; e < step.saved.size(); ++e) {
    const SavedEntry& entry = step.saved[e];
    if (entry.storage < 0 || !drops.dropped[at(entry.storage)]) continue;
    seen_values.clear();
    seen_calls.clear();
    pending.assign(1, entry.value);
    std::vector<int64_t>& calls = out.calls_of[e];
    std::vector<int64_t>& sources = out.sources_of[e];
    while (!pending.empty()) {
      const int64_t v = pending.back();
      pending.pop_back();
      if (!seen_values.insert(v).second) continue;
      if (available(step, drops, v)) {
        sources.push_back(v);
        continue;
      }
      const int64_t c = step.values[at(v)].call;
      if (!seen_calls.insert(c).second) continue;
      const RecordedCall& call = step.calls[at(c)];
      if (!call.not_replayable.empty()) {
        out.failure = "the saved " + tensor_text(entry.sizes, entry.dtype) + " tensor needs " + call.name + " (call " +
                      std::to_string(c) + ") replayed, which " + call.not_replayable;
        return out;
      }
      calls.push_back(c);
      for (const TensorSlot& slot : call.slots) {
        if (slot.stale) {
          out.failure = "the saved " + tensor_text(entry.sizes, entry.dtype) + " tensor needs " + call.name +
                        " (call " + std::to_string(c) +
                        ") replayed, which read a tensor changed in place after it was made";
          return out;
        }
        if (slot.value >= 0) pending.push_back(slot.value);
      }
    }
    std::sort(calls.begin(), calls.end());
    for (int64_t c : calls) out.replayed[at(c)] = true;
    for (int64_t v : sources) out.source[at(v)] = true;
  }
  return out;
}

std::vector<std::vector<int64_t>> storages_done_after(const RecordedStep& step, const std::vector<int64_t>& calls) {
  std::unordered_map<int64_t, size_t> last;  // storage made by the replay -> its last position
  for (size_t k = 0; k < calls.size(); ++k) {
    const RecordedCall& call = step.calls[at(calls[k])];
    for (const TensorSlot& result : call.results) last[step.values[at(result.value)].storage] = k;
    for (const TensorSlot& slot : call.slots) {
      if (slot.value < 0) continue;
      auto found = last.find(step.values[at(slot.value)].storage);
      if (found != last.end()) found->second = k;
    }
  }
  std::vector<std::vector<int64_t>> done(calls.size());
  for (const auto& [storage, k] : last) done[k].push_back(storage);
  for (auto& list : done) std::sort(list.begin(), list.end());
  return done;
}

namespace {

// The backward as the runtime serves it under a plan: a dropped entry's first unpack replays its
// calls and keeps the dropped storages they made that entries still need (all, or only its own:
// StepDrops::keep_rebuilt); kept values a replay reads are held until the last entry that may
// replay from them is served. `sample` sees the bytes at each reading and inside each replay.
template <typename Sample>
class BackwardWalk {
 public:
  BackwardWalk(const RecordedStep& step, const StepDrops& drops, const Rebuilds& rebuilds, Simulation& sim,
               Sample& sample)
      : step_(step), drops_(drops), rebuilds_(rebuilds), sim_(sim), sample_(sample) {
    const size_t n = step.storages.size();
    held_.assign(n, 0);
    pending_entries_.assign(n, 0);
    sources_on_.assign(n, 0);
    cached_.assign(n, false);
    in_use_.assign(n, 0);
    served_.assign(step.saved.size(), false);
    for (size_t s = 0; s < n; ++s) {
      held_[s] = static_cast<int64_t>(step.storages[s].saved.size());
      if (drops.dropped[s] && held_[s] > 0) dropped_held_ += step.storages[s].bytes;
    }
    for (const SavedEntry& entry : step.saved) {
      if (entry.storage >= 0 && drops.dropped[at(entry.storage)]) ++pending_entries_[at(entry.storage)];
    }
    for (const auto& sources : rebuilds.sources_of) {
      for (int64_t v : sources) {
        if (source_uses_[v]++ == 0) ++sources_on_[at(step.values[at(v)].storage)];
      }
    }
  }

  void walk(int64_t rng_states) {
    for (const BackwardEvent& event : step_.backward) {
      const int64_t held_apart = -dropped_held_ + rebuilt_bytes_ + extra_sources_ + rng_states;
      sample_(event.peak + held_apart);
      if (event.unpack) {
        unpack(event.entry, event.bytes + held_apart);
      } else {
        release(event.entry);
      }
    }
  }

 private:
  int64_t bytes(int64_t storage) const { return step_.storages[at(storage)].bytes; }

  // A rebuilt storage lives while the runtime keeps it for later unpacks (cached) and while a node
  // that unpacked it still runs (in use: from its unpack to autograd's release of the entry).
  template <typename Mutate>
  void change(int64_t t, Mutate&& mutate) {
    const bool before = cached_[at(t)] || in_use_[at(t)] > 0;
    mutate();
    const bool after = cached_[at(t)] || in_use_[at(t)] > 0;
    if (before != after) rebuilt_bytes_ += after ? bytes(t) : -bytes(t);
  }

  void release(int64_t entry) {
    const int64_t s = step_.saved[at(entry)].storage;
    if (s < 0) return;
    if (served_[at(entry)]) change(s, [&] { --in_use_[at(s)]; });
    if (--held_[at(s)] > 0) return;
    if (drops_.dropped[at(s)]) dropped_held_ -= bytes(s);
    if (sources_on_[at(s)] > 0) extra_sources_ += bytes(s);  // autograd let go; the runtime holds it
  }

  void unpack(int64_t entry, int64_t now) {
    const int64_t s = step_.saved[at(entry)].storage;
    if (s < 0 || !drops_.dropped[at(s)]) return;
    if (!cached_[at(s)]) replay(entry, s, now);
    served_[at(entry)] = true;
    change(s, [&] {
      ++in_use_[at(s)];
      if (--pending_entries_[at(s)] == 0) cached_[at(s)] = false;
    });
    for (int64_t v : rebuilds_.sources_of[at(entry)]) {
      if (--source_uses_[v] > 0) continue;
      const int64_t t = step_.values[at(v)].storage;
      if (--sources_on_[at(t)] == 0 && held_[at(t)] == 0) extra_sources_ -= bytes(t);
    }
  }

  // Whether the replay for storage `s` keeps storage `t` past its last read there.
  bool kept_after_replay(int64_t t, int64_t s) const {
    return t == s || (drops_.keep_rebuilt && drops_.dropped[at(t)] && pending_entries_[at(t)] > 0);
  }

  // The replay holds what it made until its last read there.
  void replay(int64_t entry, int64_t s, int64_t now) {
    const auto& calls = rebuilds_.calls_of[at(entry)];
    const auto done = storages_done_after(step_, calls);
    made_.clear();
    int64_t live = 0;
    for (size_t k = 0; k < calls.size(); ++k) {
      sim_.recompute_seconds += step_.calls[at(calls[k])].seconds;
      for (const TensorSlot& result : step_.calls[at(calls[k])].results) {
        const int64_t t = step_.values[at(result.value)].storage;
        if (made_.insert(t).second) live += bytes(t);
      }
      sample_(now + live);
      for (int64_t t : done[k]) {
        if (!kept_after_replay(t, s)) live -= bytes(t);
      }
    }
    for (int64_t t : made_) {
      if (kept_after_replay(t, s) && drops_.dropped[at(t)] && pending_entries_[at(t)] > 0) {
        change(t, [&] { cached_[at(t)] = true; });
      }
    }
  }

  const RecordedStep& step_;
  const StepDrops& drops_;
  const Rebuilds& rebuilds_;
  Simulation& sim_;
  Sample& sample_;
  std::vector<int64_t> held_;                         // per storage: entries autograd has not released (unplanned)
  std::vector<int64_t> pending_entries_;              // per dropped storage: entries not yet unpacked
  std::vector<int64_t> sources_on_;                   // per storage: values on it a later replay may read
  std::unordered_map<int64_t, int64_t> source_uses_;  // value -> dropped entries that may replay from it
  std::vector<bool> cached_;
  std::vector<int64_t> in_use_;
  std::vector<bool> served_;
  std::unordered_set<int64_t> made_;
  int64_t dropped_held_ = 0;   // bytes the unplanned step holds and the plan does not
  int64_t extra_sources_ = 0;  // kept storages autograd released and the runtime still holds
  int64_t rebuilt_bytes_ = 0;
};

}  // namespace

Simulation simulate(const RecordedStep& step, const StepDrops& drops, int64_t budget_bytes) {
  Simulation sim;
  const Rebuilds rebuilds = rebuilds_of(step, drops);
  if (!rebuilds.failure.empty()) {
    sim.failure = rebuilds.failure;
    return sim;
  }
  sim.feasible = true;
  // Each interval between readings (a call; the backward between two events) peaks where the
  // unplanned step's did, shifted by what the plan holds more or less then. The recorded peak is
  // the highest of those intervals' (the recorder reads and restarts the peak at each reading).
  auto sample = [&](int64_t bytes) {
    sim.peak = std::max(sim.peak, bytes);
    if (bytes > budget_bytes) sim.excess += static_cast<double>(bytes - budget_bytes);
  };
  // Forward: a dropped storage is freed where the program dropped it instead of held for backward;
  // the runtime saves the RNG's state before each random call a replay may run, until the step ends.
  std::vector<int64_t> freed_after(step.calls.size() + 1, 0);
  for (size_t s = 0; s < step.storages.size(); ++s) {
    if (drops.dropped[s]) freed_after[at(step.storages[s].dies_after) + 1] += step.storages[s].bytes;
  }
  int64_t freed = 0;
  int64_t rng_states = 0;
  for (size_t i = 0; i < step.calls.size(); ++i) {
    freed += freed_after[i];
    if (rebuilds.replayed[i] && step.calls[i].random) rng_states += step.rng_state_bytes;
    sample(step.calls[i].peak - freed + rng_states);
  }
  sim.forward_peak = sim.peak;
  BackwardWalk<decltype(sample)>(step, drops, rebuilds, sim, sample).walk(rng_states);
  return sim;
}

// Lazy greedy over `movable` storages, each set to `to` (dropped or kept) at most once: repeatedly
// the move `worth` rates highest against the plan as it is (stale ratings re-checked before a move
// is taken), while some move has a positive worth. Returns the final plan's simulation.
template <typename Worth>
Simulation toggle_greedily(const RecordedStep& step, int64_t budget_bytes, StepDrops& drops,
                           const std::vector<int64_t>& movable, bool to, Simulation current, Worth worth) {
  struct Scored {
    double worth;
    int64_t storage;
    int64_t stamp;
    bool operator<(const Scored& other) const { return worth < other.worth; }
  };
  std::priority_queue<Scored> queue;
  int64_t stamp = 0;
  auto rate = [&](int64_t s) {
    drops.dropped[at(s)] = to;
    const Simulation sim = simulate(step, drops, budget_bytes);
    drops.dropped[at(s)] = !to;
    return std::make_pair(worth(current, sim), sim);
  };
  for (int64_t s : movable) {
    if (drops.dropped[at(s)] == to) continue;
    const double w = rate(s).first;
    if (w > 0) queue.push({w, s, stamp});
  }
  while (!queue.empty()) {
    const Scored top = queue.top();
    queue.pop();
    const auto [w, sim] = rate(top.storage);
    if (w <= 0) continue;
    if (top.stamp != stamp && !queue.empty() && w < queue.top().worth) {
      queue.push({w, top.storage, stamp});
      continue;
    }
    drops.dropped[at(top.storage)] = to;
    current = sim;
    ++stamp;
  }
  return current;
}

// Where the lowest peak found lies, for the error that no plan fits: in the forward it is what the
// program itself holds (its variables, a module's outputs until it returns), which no plan frees.
static std::string where_the_peak_is(const Simulation& least) {
  if (least.forward_peak >= least.peak) {
    return " It is reached in the forward, where the program itself holds its tensors (variables alive until "
           "they go out of scope, the inputs of calls still running) and no plan can free them: let go of "
           "intermediates sooner in the forward, give a larger budget, or a smaller batch.";
  }
  return " It is reached in the backward (the forward's own peak under that plan: " +
         std::to_string(least.forward_peak) + " bytes). Give a larger budget, or a smaller batch.";
}

// Every subset of the candidates under both replay policies: the least recompute within budget
// (fewest drops among equals).
static GraphPlanChoice plan_exactly(const RecordedStep& step, int64_t budget_bytes,
                                    const std::vector<int64_t>& candidates, GraphPlanChoice choice) {
  std::optional<Simulation> best;
  uint32_t best_mask = 0;
  bool best_keeps = true;
  const uint32_t subsets = 1u << candidates.size();
  Simulation least = choice.unchecked;
  for (bool keep_rebuilt : {true, false}) {
    choice.drops.keep_rebuilt = keep_rebuilt;
    for (uint32_t mask = 1; mask < subsets; ++mask) {
      for (size_t i = 0; i < candidates.size(); ++i) choice.drops.dropped[at(candidates[i])] = ((mask >> i) & 1u) != 0;
      const Simulation sim = simulate(step, choice.drops, budget_bytes);
      if (!sim.feasible) continue;
      if (sim.peak < least.peak) least = sim;
      if (sim.peak > budget_bytes) continue;
      const bool better = !best || sim.recompute_seconds < best->recompute_seconds ||
                          (sim.recompute_seconds == best->recompute_seconds &&
                           __builtin_popcount(mask) < __builtin_popcount(best_mask));
      if (better) {
        best = sim;
        best_mask = mask;
        best_keeps = keep_rebuilt;
      }
    }
  }
  REMAT_CHECK(best.has_value(), "no plan keeps this step within ", budget_bytes, " bytes: of every choice among the ",
              candidates.size(), " saved memory blocks a replay can rebuild, the lowest predicted peak is ", least.peak,
              " bytes (the unplanned step's: ", choice.unchecked.peak, ").", where_the_peak_is(least));
  for (size_t i = 0; i < candidates.size(); ++i) choice.drops.dropped[at(candidates[i])] = ((best_mask >> i) & 1u) != 0;
  choice.drops.keep_rebuilt = best_keeps;
  choice.simulation = *best;
  choice.search = "every subset";
  return choice;
}

// Storages autograd saved that a replay can rebuild when dropped alone.
static std::vector<int64_t> droppable_storages(const RecordedStep& step) {
  std::vector<int64_t> candidates;
  StepDrops one;
  one.dropped.assign(step.storages.size(), false);
  for (size_t s = 0; s < step.storages.size(); ++s) {
    const RecordedStorage& storage = step.storages[s];
    if (storage.outside || storage.saved.empty() || storage.bytes == 0) continue;
    one.dropped[s] = true;
    if (rebuilds_of(step, one).failure.empty()) candidates.push_back(static_cast<int64_t>(s));
    one.dropped[s] = false;
  }
  return candidates;
}

namespace {

// The chain dynamic program over the execution order. A plan of cuts: after some calls, the
// storages alive across the cut (made at or before it, read after it) are kept, as a checkpointed
// segment's input is; every other candidate is dropped and its segment replayed in backward. Each
// candidate belongs to the segment that made it: kept when it outlives the segment, else dropped.
// The program's model of the peak while the backward serves segment j is what the earlier segments
// keep plus all of segment j (a segment's replay rebuilds it whole), above a constant calibrated on
// the unplanned step; its model of the time is the segment's calls up to its last dropped storage.
// The exact walk (simulate) grades the plan; the program's memory cap is moved by the walk's error.
class CutProgram {
 public:
  CutProgram(const RecordedStep& step, const std::vector<int64_t>& candidates, int64_t unchecked_peak)
      : step_(step), candidates_(candidates), calls_(static_cast<int64_t>(step.calls.size())) {
    const size_t n = step.storages.size();
    born_.assign(n, std::numeric_limits<int64_t>::max());
    end_.assign(n, -1);
    for (const RecordedValue& value : step.values) {
      const size_t s = at(value.storage);
      born_[s] = std::min(born_[s], value.call);
      end_[s] = std::max({end_[s], value.call, value.last_read});
    }
    born_at_.resize(at(calls_));
    end_at_.resize(at(calls_));
    for (int64_t s : candidates) {
      born_at_[at(born_[at(s)])].push_back(s);
      end_at_[at(end_[at(s)])].push_back(s);
      total_ += step.storages[at(s)].bytes;
    }
    seconds_before_.assign(at(calls_) + 1, 0.0);
    for (int64_t c = 0; c < calls_; ++c)
      seconds_before_[at(c) + 1] = seconds_before_[at(c)] + step.calls[at(c)].seconds;
    others_ = unchecked_peak - total_;
    // What a cut keeps changes only where a candidate is made or last read: cuts just before and
    // just after those calls (the latest cut of each stretch recomputes least), and after the last.
    std::vector<int64_t> cuts;
    for (int64_t s : candidates) {
      for (int64_t event : {born_[at(s)], end_[at(s)]}) {
        if (event >= 1) cuts.push_back(event - 1);
        cuts.push_back(event);
      }
    }
    cuts.push_back(calls_ - 1);
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    cuts_ = std::move(cuts);
  }

  int64_t others() const { return others_; }

  // The cuts of least modelled time whose modelled peak is at most `cap` (bytes above others());
  // nullopt when none is.
  std::optional<StepDrops> plan(int64_t cap) const {
    if (cap <= 0 || total_ <= 0) return std::nullopt;
    constexpr int64_t kLevels = 64;
    const int64_t unit = std::max<int64_t>(1, (total_ + kLevels - 1) / kLevels);
    const size_t width = kLevels + 1;
    const size_t states = cuts_.size() + 1;  // 0: before the first call; i + 1: after call cuts_[i]
    constexpr double kNone = std::numeric_limits<double>::infinity();
    // best[state * width + k]: least time with the last segment ending at the state's cut, k units kept.
    std::vector<double> best(states * width, kNone);
    std::vector<std::pair<int32_t, int32_t>> parent(best.size(), {-1, -1});
    best[0] = 0;
    for (size_t i = 0; i + 1 < states; ++i) {
      const int64_t a = i == 0 ? -1 : cuts_[i - 1];
      const size_t from = i * width;
      int64_t first_level = -1;
      for (int64_t k = 0; k <= kLevels && first_level < 0; ++k) first_level = best[from + at(k)] < kNone ? k : -1;
      if (first_level < 0) continue;
      int64_t kept = 0, dropped = 0, last_dropped = -1;
      size_t j = i;  // the next cut to relax
      for (int64_t b = a + 1; b < calls_ && j < cuts_.size(); ++b) {
        for (int64_t s : born_at_[at(b)]) {
          if (end_[at(s)] > b) {
            kept += step_.storages[at(s)].bytes;
          } else {
            dropped += step_.storages[at(s)].bytes;
            last_dropped = b;
          }
        }
        for (int64_t s : end_at_[at(b)]) {
          const int64_t born = born_[at(s)];
          if (born <= a || born == b) continue;
          kept -= step_.storages[at(s)].bytes;
          dropped += step_.storages[at(s)].bytes;
          last_dropped = std::max(last_dropped, born);
        }
        if (first_level * unit + kept + dropped > cap) break;  // longer segments only add
        if (cuts_[j] != b) continue;
        const double time = dropped > 0 ? seconds_before_[at(last_dropped) + 1] - seconds_before_[at(a) + 1] : 0.0;
        const int64_t step_levels = (kept + unit - 1) / unit;
        const size_t to = (j + 1) * width;
        for (int64_t k = first_level; k + step_levels <= kLevels; ++k) {
          const double here = best[from + at(k)];
          if (here == kNone) continue;
          if (k * unit + kept + dropped > cap) break;
          double& there = best[to + at(k + step_levels)];
          if (here + time < there) {
            there = here + time;
            parent[to + at(k + step_levels)] = {static_cast<int32_t>(i), static_cast<int32_t>(k)};
          }
        }
        ++j;
      }
    }
    const size_t last = (states - 1) * width;  // the last cut is after the last call
    int64_t level = -1;
    for (int64_t k = 0; k <= kLevels; ++k) {
      if (best[last + at(k)] < kNone && (level < 0 || best[last + at(k)] < best[last + at(level)])) level = k;
    }
    if (level < 0) return std::nullopt;
    std::vector<int64_t> segment_end(at(calls_), calls_ - 1);  // per call: the last call of its segment
    for (size_t state = states - 1; state > 0;) {
      const auto [from_state, k] = parent[state * width + at(level)];
      const int64_t b = cuts_[state - 1];
      const int64_t a = from_state == 0 ? -1 : cuts_[at(from_state) - 1];
      for (int64_t c = a + 1; c <= b; ++c) segment_end[at(c)] = b;
      state = at(from_state);
      level = k;
    }
    StepDrops drops;
    drops.dropped.assign(step_.storages.size(), false);
    for (int64_t s : candidates_) drops.dropped[at(s)] = end_[at(s)] <= segment_end[at(born_[at(s)])];
    return drops;
  }

 private:
  const RecordedStep& step_;
  const std::vector<int64_t>& candidates_;
  int64_t calls_;
  std::vector<int64_t> born_, end_;  // per storage: the call making its first value; the last reading any
  std::vector<std::vector<int64_t>> born_at_, end_at_;
  std::vector<double> seconds_before_;
  std::vector<int64_t> cuts_;  // the calls a cut may follow, ascending; the last call's last
  int64_t total_ = 0;          // candidates' bytes
  int64_t others_ = 0;         // the unplanned peak above the candidates' bytes
};

}  // namespace

// The cut program's plans, graded by the walk, its cap moved by the walk's error: the fastest that
// fits, under either replay policy; nullopt when none does.
static std::optional<std::pair<StepDrops, Simulation>> plan_by_cuts(const RecordedStep& step, int64_t budget_bytes,
                                                                    const std::vector<int64_t>& candidates,
                                                                    const Simulation& unchecked) {
  const CutProgram program(step, candidates, unchecked.peak);
  std::optional<std::pair<StepDrops, Simulation>> best;
  int64_t cap = budget_bytes - program.others();
  int64_t low = 0, high = std::numeric_limits<int64_t>::max();  // caps known to fit / to pass the budget
  for (int round = 0; round < 8 && cap > low && cap < high; ++round) {
    const std::optional<StepDrops> cut = program.plan(cap);
    if (!cut) {
      low = cap;
      cap = high == std::numeric_limits<int64_t>::max() ? cap * 2 : low + (high - low) / 2;
      continue;
    }
    std::optional<Simulation> graded;  // under the policy the program models: a segment rebuilt whole
    for (bool keep_rebuilt : {true, false}) {
      StepDrops drops = *cut;
      drops.keep_rebuilt = keep_rebuilt;
      const Simulation sim = simulate(step, drops, budget_bytes);
      if (keep_rebuilt) graded = sim;
      if (sim.feasible && sim.peak <= budget_bytes &&
          (!best || sim.recompute_seconds < best->second.recompute_seconds)) {
        best.emplace(drops, sim);
      }
    }
    if (!graded->feasible) break;
    if (graded->peak > budget_bytes) {
      high = cap;
      cap = std::max(low + 1, std::min(cap - (graded->peak - budget_bytes), low + (high - low) / 2));
    } else {
      low = cap;
      const int64_t slack = budget_bytes - graded->peak;
      if (slack < budget_bytes / 200) break;  // within half a percent
      cap = high == std::numeric_limits<int64_t>::max() ? cap + slack : std::min(cap + slack, low + (high - low) / 2);
    }
  }
  return best;
}

// The heuristic searches, the fastest plan that fits taken: the cut program's plan (unless
// `search_kind` is greedy) and greedy searches under either replay policy (StepDrops::keep_rebuilt;
// unless it is segments). From keeping everything, drop what removes the most excess over budget
// per second of replay; from dropping everything (only where nothing fits yet), keep again what
// removes the most excess (the kept storages become the boundaries replays start from, as
// segments' inputs in a chain). Each plan then keeps again what saves replay time within the budget.
static GraphPlanChoice plan_greedily(const RecordedStep& step, int64_t budget_bytes,
                                     const std::vector<int64_t>& candidates, GraphPlanChoice choice,
                                     PlanSearch search_kind) {
  auto fits_then_faster = [&](const Simulation& now, const Simulation& sim, bool time_first) {
    if (!sim.feasible) return -1.0;
    if (now.peak > budget_bytes) {
      if (sim.excess >= now.excess) return -1.0;
      const double added = sim.recompute_seconds - now.recompute_seconds;
      return time_first ? (now.excess - sim.excess) / std::max(added, 1e-7) : now.excess - sim.excess;
    }
    if (sim.peak > budget_bytes || sim.recompute_seconds >= now.recompute_seconds) return -1.0;
    return now.recompute_seconds - sim.recompute_seconds;
  };
  auto per_second = [&](const Simulation& now, const Simulation& next) { return fits_then_faster(now, next, true); };
  auto most_bytes = [&](const Simulation& now, const Simulation& next) { return fits_then_faster(now, next, false); };
  std::optional<std::pair<StepDrops, Simulation>> best;
  std::string found_by;
  auto consider = [&](const StepDrops& drops, const Simulation& sim, const char* search) {
    if (!sim.feasible || sim.peak > budget_bytes) return;
    if (!best || sim.recompute_seconds < best->second.recompute_seconds) {
      best.emplace(drops, sim);
      found_by = search;
    }
  };
  Simulation least = choice.unchecked;
  auto search = [&](StepDrops drops, bool from_all_dropped) {
    Simulation sim;
    if (from_all_dropped) {
      for (int64_t c : candidates) drops.dropped[at(c)] = true;
      sim = simulate(step, drops, budget_bytes);
      if (!sim.feasible) return;
      sim = toggle_greedily(step, budget_bytes, drops, candidates, /*to=*/false, sim, most_bytes);
    } else {
      sim = toggle_greedily(step, budget_bytes, drops, candidates, /*to=*/true, choice.unchecked, per_second);
    }
    if (sim.peak <= budget_bytes) {
      sim = toggle_greedily(step, budget_bytes, drops, candidates, /*to=*/false, sim, per_second);
    }
    if (sim.peak < least.peak) least = sim;
    consider(drops, sim, from_all_dropped ? "greedy, from dropping all" : "greedy, from keeping all");
  };
  // The cut program's plan, made faster by keeping again what saves time within the budget.
  if (search_kind != PlanSearch::greedy) {
    if (auto cut = plan_by_cuts(step, budget_bytes, candidates, choice.unchecked)) {
      StepDrops drops = cut->first;
      const Simulation sim =
          toggle_greedily(step, budget_bytes, drops, candidates, /*to=*/false, cut->second, per_second);
      consider(drops, sim, "cut program");
    }
  }
  // From keeping all first (fast: few replays to walk); from dropping all only where that fails.
  for (bool from_all_dropped : {false, true}) {
    if (search_kind == PlanSearch::segments || (from_all_dropped && best)) break;
    for (bool keep_rebuilt : {true, false}) {
      StepDrops drops = choice.drops;
      drops.keep_rebuilt = keep_rebuilt;
      search(drops, from_all_dropped);
    }
  }
  REMAT_CHECK(best.has_value(), "no plan keeps this step within ", budget_bytes, " bytes: the lowest predicted peak ",
              "the planner found, among the ", candidates.size(), " saved memory blocks a replay can rebuild, is ",
              least.peak, " bytes (the unplanned step's: ", choice.unchecked.peak, ").", where_the_peak_is(least));
  choice.drops = best->first;
  choice.simulation = best->second;
  choice.search = found_by;
  return choice;
}

GraphPlanChoice plan_drops(const RecordedStep& step, int64_t budget_bytes, PlanSearch search_kind) {
  GraphPlanChoice choice;
  choice.drops.dropped.assign(step.storages.size(), false);
  choice.unchecked = simulate(step, choice.drops, budget_bytes);
  choice.simulation = choice.unchecked;
  const std::vector<int64_t> candidates = droppable_storages(step);
  choice.candidates = static_cast<int64_t>(candidates.size());
  if (choice.unchecked.peak <= budget_bytes) return choice;
  const bool exact = search_kind == PlanSearch::exact ||
                     (search_kind == PlanSearch::automatic && candidates.size() <= kExactCandidates);
  if (exact) {
    TORCH_INTERNAL_ASSERT(candidates.size() <= 20, "an exact plan over ", candidates.size(), " storages");
    return plan_exactly(step, budget_bytes, candidates, std::move(choice));
  }
  return plan_greedily(step, budget_bytes, candidates, std::move(choice), search_kind);
}

}  // namespace remat::detail
