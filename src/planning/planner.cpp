#include "remat/planning/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <mutex>
#include <stdexcept>

#include <ATen/Parallel.h>

#include "remat/base/error.h"
#include "remat/memory/memory.h"
#include "remat/chain/policies.h"

namespace remat {
namespace detail {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

static int64_t round_up(int64_t bytes, int64_t unit) { return (bytes + unit - 1) / unit; }

// Stage costs in memory units, option by option (rounded up: feasible in units => fits in bytes).
struct UnitStage {
  int64_t x = 0, input_grad = 0, nograd_extra = 0, parameters = 0;
  double nograd_seconds = 0, recompute_extra_seconds = 0;
  struct Option {
    int64_t kept, forward_extra, backward_extra;
    double seconds;
  };
  std::vector<Option> options;
  std::vector<Option> end_options;  ///< the same options where the stage ends a recomputed segment
};

static std::vector<UnitStage> to_units(const CostTable& costs, int64_t unit) {
  std::vector<UnitStage> out;
  for (const auto& s : costs.stages) {
    UnitStage u;
    u.x = round_up(s.output_bytes, unit);
    u.input_grad = round_up(s.input_grad_bytes, unit);
    u.nograd_extra = round_up(s.nograd_extra_bytes, unit);
    u.parameters = round_up(s.parameter_bytes, unit);
    u.nograd_seconds = s.nograd_seconds;
    u.recompute_extra_seconds = s.recompute_extra_seconds;
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

}  // namespace detail

using detail::kInfinity;
using detail::round_up;
using detail::to_units;
using detail::UnitStage;

// The table and its backtracking; OptimalPlanner is its public face.
//
// Each range s..t holds only its window of memory slots [lo, hi]: below lo no plan of the range
// fits, and from hi up every candidate's cost is constant (its own threshold and its subranges'
// windows are all passed), so the value and the choice at hi stand for every slot above. A long
// chain's short ranges need few slots of a grid sized for the whole chain: the table and the slot
// updates filling it shrink by that ratio, with the same values and choices as a dense table.
class OptimalPlanner::Table {
 public:
  /// `filled_units`: the highest slot filled (default: every slot). The values at and below it are
  /// the full table's (a slot's value reads only lower ones): enough to find the least-memory plan.
  Table(CostTable costs, const PlannerOptions& options, int64_t max_budget_bytes, bool refine_least,
        int64_t filled_units = -1);
  PlanResult plan(int64_t budget_bytes) const;
  double least_seconds(int64_t budget_bytes) const;

  double cost(int64_t s, int64_t t, int64_t m) const;
  void build(int64_t s, int64_t t, int64_t m, std::vector<PlanItem>& items, Plan& plan) const;
  void find_least_memory_plan();
  void refine_least_feasible_budget();
  /// Units a reentrant segment ending at t holds through the backward of its stages before
  /// `first`: the parameter gradients of stages first..t (returned all at once when it ends) and
  /// δ(t), its backward's argument. 0 at the top level (subproblems ending at n-1) and for
  /// first > t; see docs/planner.md.
  int64_t held_in_segment_units(int64_t first, int64_t t) const {
    // Non-reentrant segments add gradients to .grad as they come and free δ(t) once used.
    if (!reentrant_ || t >= n_ - 1 || first > t) return 0;
    return parameter_units_before_[t + 1] - parameter_units_before_[first] + stages_[static_cast<size_t>(t)].x;
  }

  /// The slots a range's entries cover, and its value at hi (its least); hi < lo where no plan of
  /// it fits any slot.
  struct Window {
    int32_t lo = 0, hi = -1;
    double top = 0;
    bool empty() const { return hi < lo; }
  };
  /// One way to run range s..t: record stage s with an option, or checkpoint s..j-1. At slot m its
  /// cost is `seconds` + rest(m - rest_offset) + inner(m - inner_offset), from `lowest` up.
  struct Candidate {
    int32_t choice;  // < max_options_: record with that option; >= max_options_: segment end j
    double seconds;
    int64_t lowest;
    const Window* rest;  // range rest_s..t (s+1 or j); null: none
    int64_t rest_s, rest_offset;
    const Window* inner;  // range s..inner_t (j-1); null: none
    int64_t inner_t, inner_offset;
  };
  /// Where a candidate starts (its threshold and its subranges' lowest slots), from where it is
  /// constant (their highest), and its value there, the least it takes.
  struct Span {
    int64_t start, end;
    double top;
  };
  /// Ranges of at most longest_ stages (those inside a segment, and the chain's last ones) by first
  /// stage and by length; the longer ranges that end the chain, one per first stage.
  const Window& window(int64_t s, int64_t t) const {
    const int64_t length = t - s + 1;
    return length <= longest_ ? by_start_[static_cast<size_t>(s)][static_cast<size_t>(length - 1)]
                              : rest_windows_[static_cast<size_t>(s)];
  }
  /// Where range s..t's entries start in values_ and choices_: its row's entry for slot m is at
  /// `first_entry(s, t) + m - lo`.
  size_t first_entry(int64_t s, int64_t t) const {
    const int64_t length = t - s + 1;
    return length <= longest_ ? first_entries_[static_cast<size_t>(s)][static_cast<size_t>(length - 1)]
                              : rest_first_entries_[static_cast<size_t>(s)];
  }
  /// Calls `each` with the candidates of range s..t that record stage s, one per option.
  template <typename Each>
  void for_each_option(int64_t s, int64_t t, Each&& each) const;
  struct Worker;
  /// Range s..t's window (from its subranges'), its entries appended, filled, and where they start
  /// set in `first_entry`.
  Window fill_range(int64_t s, int64_t t, size_t& first_entry, Worker& worker);
  /// The first pass: the window's lo and hi (empty where no plan fits), each candidate that can
  /// fill a slot kept in worker.pending[0, pending).
  Window find_window(int64_t s, int64_t t, size_t& pending, Worker& worker);
  /// The second pass: the window's entries appended (where: `first_entry`), filled, and its top.
  void fill_row(int64_t s, int64_t t, size_t& first_entry, size_t pending, Window& w, Worker& worker);
  /// The dynamic program over every range and the slots of its window (docs/planner.md), segments
  /// as long as the bounds allow.
  void fill_table();

  CostTable costs_;
  PlannerOptions options_;
  Plan plain_;  // names, granularity, default options and mode of every plan it returns
  Prediction unchecked_;
  int64_t n_ = 0, slots_ = 0, unit_ = 1, least_feasible_bytes_ = -1;
  int64_t filled_ = 0;  // the highest slot filled
  Plan least_memory_plan_;
  double fill_seconds_ = 0;
  int64_t min_units_ = -1;  // the least memory, in units, at which the chain is feasible
  std::vector<UnitStage> stages_;
  // Per stage, what every segment end reads: its output, its output and no-grad transient, its
  // no-grad seconds.
  std::vector<int64_t> units_x_, nograd_units_;
  std::vector<double> nograd_seconds_;
  int64_t segment_units_ = 0;
  std::vector<int64_t> parameter_units_before_;  // of stages [0, k)
  int64_t longest_ = 0;                          // the most stages a segment spans
  // by_start_[s][length - 1] and by_end_[t][length - 1], the same windows: the segment loop reads
  // the ranges s..j-1 and j..t of one range contiguously, as j grows.
  std::vector<std::vector<Window>> by_start_, by_end_;
  std::vector<Window> rest_windows_;
  std::vector<std::vector<size_t>> first_entries_;  // [s][length - 1], as by_start_
  std::vector<size_t> rest_first_entries_;
  /// One range's candidates between the passes of fill_range (the first finds its window, the
  /// second fills it): where each starts, its least value and its own seconds.
  struct Pending {
    int32_t choice, start;
    double top, seconds;
  };
  /// The rows' entries, least time and Candidate::choice per slot, in blocks that never move: a
  /// growing vector would copy the table at every doubling and touch its pages twice. Workers
  /// filling ranges at once each append to blocks of their own (a cursor each).
  class Entries {
   public:
    /// Entries in a block: at least the longest row (memory_slots at most 100000, plus one).
    static constexpr size_t kBlock = size_t{1} << 17;
    struct Cursor {
      size_t block = 0, used = kBlock;
      size_t appended = 0;  // entries, not counting blocks' unused ends
    };
    /// Room for `count` contiguous entries (at most a block), uninitialised; the index of the first.
    size_t append(Cursor& cursor, size_t count) {
      TORCH_INTERNAL_ASSERT(count <= kBlock, "planner: a row of ", count, " entries exceeds a block");
      if (cursor.used + count > kBlock) {
        cursor.block = new_block();
        cursor.used = 0;
      }
      const size_t first = cursor.block * kBlock + cursor.used;
      cursor.used += count;
      cursor.appended += count;
      return first;
    }
    double* values(size_t index) { return values_[index / kBlock].get() + index % kBlock; }
    const double* values(size_t index) const { return values_[index / kBlock].get() + index % kBlock; }
    int32_t* choices(size_t index) { return choices_[index / kBlock].get() + index % kBlock; }
    const int32_t* choices(size_t index) const { return choices_[index / kBlock].get() + index % kBlock; }

   private:
    size_t new_block() {
      const std::lock_guard<std::mutex> lock(mutex_);
      // The table's bound (kMaxTableBytes) in rows of up to a block each, a partial block per worker.
      TORCH_INTERNAL_ASSERT(blocks_ < values_.size(), "planner: the table outgrew its blocks");
      values_[blocks_].reset(new double[kBlock]);
      choices_[blocks_].reset(new int32_t[kBlock]);
      return blocks_++;
    }
    // Sized once: workers read blocks while another claims one.
    std::vector<std::unique_ptr<double[]>> values_ = std::vector<std::unique_ptr<double[]>>(1024);
    std::vector<std::unique_ptr<int32_t[]>> choices_ = std::vector<std::unique_ptr<int32_t[]>>(1024);
    std::mutex mutex_;
    size_t blocks_ = 0;
  };
  /// What one thread writes while it fills ranges: candidates between the passes, where its entries
  /// go, and its work (candidates weighed and slots updated).
  struct Worker {
    std::vector<Pending> pending;
    Entries::Cursor cursor;
    double work = 0;
  };
  std::vector<Worker> workers_;  // one per thread of at::get_num_threads()
  Entries entries_;
  int32_t max_options_ = 1;
  bool reentrant_ = false;
};

namespace {

// Bounds on the table (12 bytes an entry, and a range's window 40 bytes: two copies and where its
// entries start) and on the work filling it (candidates weighed and slots updated, a few
// nanoseconds each): a plan takes 256 MiB and seconds at most, whatever the chain's length.
constexpr double kMaxTableBytes = 256 << 20;
constexpr double kEntryBytes = 12, kRangeBytes = 40;
constexpr double kMaxWork = 4e8;

}  // namespace

double OptimalPlanner::Table::cost(int64_t s, int64_t t, int64_t m) const {
  const Window& w = window(s, t);
  if (m < w.lo || w.empty()) return kInfinity;
  return entries_.values(first_entry(s, t))[std::min<int64_t>(m, w.hi) - w.lo];
}

template <typename Each>
void OptimalPlanner::Table::for_each_option(int64_t s, int64_t t, Each&& each) const {
  const UnitStage& first = stages_[s];
  const int64_t grad_t = stages_[t].x;
  // A range that ends before the last stage is the inside of a segment, whose last stage (s == t)
  // its recompute runs graph-only.
  const bool segment_end = s == t && t < n_ - 1;
  const double recompute_extra = t < n_ - 1 ? first.recompute_extra_seconds : 0.0;
  for (size_t o = 0; o < first.options.size(); ++o) {
    const auto& opt = segment_end ? first.end_options[o] : first.options[o];
    const int64_t lowest =
        std::max(grad_t + opt.kept + opt.forward_extra,
                 first.x + opt.kept + first.input_grad + opt.backward_extra + held_in_segment_units(s + 1, t));
    each(Candidate{static_cast<int32_t>(o), opt.seconds + recompute_extra, lowest, s == t ? nullptr : &window(s + 1, t),
                   s + 1, opt.kept, nullptr, -1, 0});
  }
}

OptimalPlanner::Table::Window OptimalPlanner::Table::find_window(int64_t s, int64_t t, size_t& pending_count,
                                                                 Worker& worker) {
  // Sums in the order the slot loops below add them, so that a value there equals `top` bitwise.
  auto span = [&](const Candidate& c) -> std::optional<Span> {
    Span out{c.lowest, c.lowest, c.seconds};
    if (c.rest) {
      if (c.rest->empty()) return std::nullopt;
      out.start = std::max(out.start, c.rest_offset + c.rest->lo);
      out.end = std::max(out.end, c.rest_offset + c.rest->hi);
      out.top = out.top + c.rest->top;
    }
    if (c.inner) {
      if (c.inner->empty()) return std::nullopt;
      out.start = std::max(out.start, c.inner_offset + c.inner->lo);
      out.end = std::max(out.end, c.inner_offset + c.inner->hi);
      out.top = out.top + c.inner->top;
    }
    if (out.start > filled_) return std::nullopt;
    return out;
  };
  // The window ends where the row first takes its least value: the least of the candidates' tops,
  // reached at the earliest end among those that take it (a subrange's value is above its top below
  // its hi, so a candidate reaches its top at its end). Above, the row keeps that value and the
  // choice there stays feasible: a dense row's choices there may break ties otherwise, at equal cost.
  Window w;
  w.lo = static_cast<int32_t>(filled_ + 1);
  double least_top = kInfinity;
  int64_t least_top_from = filled_;
  // Sized once per table, written field by field: this loop runs for every candidate of every range.
  std::vector<Pending>& kept = worker.pending;
  kept.resize(static_cast<size_t>(max_options_ + longest_));
  size_t pending = 0;  // a local: through the reference it would be stored at every candidate
  int64_t weighed = 0;
  auto keep = [&](int32_t choice, int64_t start, int64_t end, double top, double seconds) {
    Pending& p = kept[pending++];
    p.choice = choice;
    p.start = static_cast<int32_t>(start);
    p.top = top;
    p.seconds = seconds;
    w.lo = static_cast<int32_t>(std::min<int64_t>(w.lo, start));
    if (top < least_top || (top == least_top && end < least_top_from)) {
      least_top = top;
      least_top_from = end;
    }
  };
  // Record stage s with each of its options, in the order ties are broken: options first, then
  // segment ends in increasing order.
  for_each_option(s, t, [&](const Candidate& c) {
    ++weighed;
    if (const auto sp = span(c)) keep(c.choice, sp->start, sp->end, sp->top, c.seconds);
  });
  // Checkpoint stages s..j-1 (a segment never ends at t: that would only add a forward). A
  // segment's own cost (the checkpoint call, its RNG state, the recompute's autograd run) is paid
  // once, however many stages it spans. Every range's every segment end passes here: the spans are
  // worked out inline, from the stages' compact arrays and the windows' contiguous lists.
  const int64_t grad_t = stages_[static_cast<size_t>(t)].x;
  double forward_seconds = costs_.segment_seconds();
  int64_t forward_peak = 0;
  const Window* inner = by_start_[static_cast<size_t>(s)].data();  // inner[j - s - 1]: range s..j-1
  const Window* rest = by_end_[static_cast<size_t>(t)].data();     // rest[t - j]: range j..t
  const int64_t* x = units_x_.data();
  const int64_t last_end = std::min(t, s + longest_);
  for (int64_t j = s + 1; j <= last_end; ++j) {
    const int64_t k = j - 1;  // the stage the segment's no-grad forward now also runs
    const int64_t held_input = k == s ? 0 : x[k - 1];
    forward_peak = std::max(forward_peak, segment_units_ + grad_t + held_input + nograd_units_[k]);
    forward_seconds += nograd_seconds_[k];
    const int64_t held_in_backward = 2 * segment_units_ + held_in_segment_units(j, t);
    const int64_t rest_offset = x[k] + segment_units_;
    const int64_t lowest = std::max(forward_peak, std::max(rest_offset, held_in_backward));
    if (lowest > filled_) break;  // the forward's peak only grows with j
    ++weighed;
    const Window& r = t - j + 1 <= longest_ ? rest[t - j] : rest_windows_[static_cast<size_t>(j)];
    const Window& i = inner[j - s - 1];
    if (r.empty() || i.empty()) continue;
    const int64_t start = std::max(lowest, std::max(rest_offset + r.lo, held_in_backward + i.lo));
    if (start > filled_) continue;
    const int64_t end = std::max(lowest, std::max(rest_offset + r.hi, held_in_backward + i.hi));
    // Summed as span() and the slot loops sum: forward, rest, inner.
    keep(max_options_ + static_cast<int32_t>(j), start, end, (forward_seconds + r.top) + i.top, forward_seconds);
  }
  worker.work += static_cast<double>(weighed);
  if (w.lo <= filled_) w.hi = static_cast<int32_t>(std::min(least_top_from, filled_));
  pending_count = pending;
  return w;
}

void OptimalPlanner::Table::fill_row(int64_t s, int64_t t, size_t& first_entry, size_t pending, Window& w,
                                     Worker& worker) {
  const size_t count = static_cast<size_t>(w.hi - w.lo + 1);
  first_entry = entries_.append(worker.cursor, count);
  double* row = entries_.values(first_entry) - w.lo;  // row[m], m in [lo, hi]
  int32_t* chosen = entries_.choices(first_entry) - w.lo;
  std::fill_n(row + w.lo, count, kInfinity);
  std::fill_n(chosen + w.lo, count, -1);
  // The slots innermost, over contiguous entries; a subrange read at slot m' holds its value at
  // min(m', its hi). Ties keep the earlier candidate. The row only falls with m (each candidate's
  // value does), so a candidate cannot improve the slots from the first whose value is at most its
  // top: those are skipped.
  const UnitStage& first = stages_[static_cast<size_t>(s)];
  const bool segment_end = s == t && t < n_ - 1;
  for (size_t q = 0; q < pending; ++q) {
    const Pending& p = worker.pending[q];
    if (p.start > w.hi || !(row[p.start] > p.top)) continue;
    const Candidate c = [&] {
      if (p.choice < max_options_) {
        const auto& opt = segment_end ? first.end_options[p.choice] : first.options[p.choice];
        return Candidate{p.choice, p.seconds, 0, s == t ? nullptr : &window(s + 1, t), s + 1, opt.kept, nullptr, -1, 0};
      }
      const int64_t j = p.choice - max_options_;
      return Candidate{p.choice,          p.seconds, 0,
                       &window(j, t),     j,         stages_[j - 1].x + segment_units_,
                       &window(s, j - 1), j - 1,     2 * segment_units_ + held_in_segment_units(j, t)};
    }();
    const Span sp{p.start, 0, p.top};
    const int64_t end =
        std::partition_point(row + sp.start, row + w.hi + 1, [&](double value) { return value > sp.top; }) - row - 1;
    worker.work += static_cast<double>(end - sp.start + 1);
    auto update = [&](int64_t m, double total_seconds) {
      if (total_seconds < row[m]) {
        row[m] = total_seconds;
        chosen[m] = c.choice;
      }
    };
    if (!c.rest) {
      for (int64_t m = sp.start; m <= end; ++m) update(m, c.seconds);
      continue;
    }
    // Split where a subrange's window ends, so that each loop reads contiguous entries (or one).
    const Window& r = *c.rest;
    const double* rest =
        entries_.values(this->first_entry(c.rest_s, t)) - r.lo - c.rest_offset;  // rest[m]: at slot m - offset
    const int64_t rest_ends = std::min<int64_t>(end, r.hi + c.rest_offset);
    if (!c.inner) {
      for (int64_t m = sp.start; m <= rest_ends; ++m) update(m, c.seconds + rest[m]);
      for (int64_t m = std::max(sp.start, rest_ends + 1); m <= end; ++m) update(m, c.seconds + r.top);
      continue;
    }
    const Window& i = *c.inner;
    const double* inner = entries_.values(this->first_entry(s, c.inner_t)) - i.lo - c.inner_offset;
    const int64_t inner_ends = std::min<int64_t>(end, i.hi + c.inner_offset);
    const int64_t both = std::min(rest_ends, inner_ends);
    for (int64_t m = sp.start; m <= both; ++m) update(m, c.seconds + rest[m] + inner[m]);
    int64_t m = std::max(sp.start, both + 1);
    for (; m <= rest_ends; ++m) update(m, c.seconds + rest[m] + i.top);
    for (; m <= inner_ends; ++m) update(m, c.seconds + r.top + inner[m]);
    for (; m <= end; ++m) update(m, c.seconds + r.top + i.top);
  }
  w.top = row[w.hi];
}

OptimalPlanner::Table::Window OptimalPlanner::Table::fill_range(int64_t s, int64_t t, size_t& first_entry,
                                                                Worker& worker) {
  size_t pending = 0;
  Window w = find_window(s, t, pending, worker);
  if (!w.empty()) fill_row(s, t, first_entry, pending, w, worker);
  return w;
}

void OptimalPlanner::Table::fill_table() {
  // A range's candidates read only shorter ranges: by length. Segments grow one stage a length
  // while the table, with what the next length and the chain's longer ranges could still take (each
  // at most a full row of slots), stays within its bound, and the work so far with the candidates
  // those ranges weigh within its; then the chain's longer ranges, from the last stage back.
  const double row = static_cast<double>(filled_ + 1);
  auto within_bounds = [&](int64_t longest) {
    double entries = 0, work = 0;  // so far, every worker's
    for (const Worker& w : workers_) {
      entries += static_cast<double>(w.cursor.appended);
      work += w.work;
    }
    const double next = static_cast<double>(std::max<int64_t>(0, n_ - longest));        // ranges of length+1
    const double longer = static_cast<double>(std::max<int64_t>(0, n_ - longest - 1));  // beyond it
    const double ranges = static_cast<double>(longest) * static_cast<double>(n_) + next + longer;
    const double bytes = kEntryBytes * (entries + (next + longer) * row) + kRangeBytes * ranges;
    // Each range of the next length, and each longer one, weighs one candidate per option and per end
    // of its first segment.
    const double weighed = (next + longer) * static_cast<double>(max_options_ + longest + 1);
    return bytes <= kMaxTableBytes && work + weighed <= kMaxWork;
  };
  REMAT_CHECK(within_bounds(0), "planner: a chain of ", n_, " stages with ", slots_,
              " memory slots needs a table of up to ",
              kEntryBytes * static_cast<double>(n_) * row + kRangeBytes * static_cast<double>(n_), " bytes (at most ",
              kMaxTableBytes, "); plan fewer stages (a coarser granularity) or with fewer memory slots.");
  by_start_.assign(static_cast<size_t>(n_), {});
  by_end_.assign(static_cast<size_t>(n_), {});
  first_entries_.assign(static_cast<size_t>(n_), {});
  // Where every range fits a quarter of the bound, its lists are sized once: growing them a range at
  // a time would copy each a dozen times.
  if (kRangeBytes * static_cast<double>(n_) * static_cast<double>(n_ + 1) / 2 <= kMaxTableBytes / 4) {
    for (int64_t s = 0; s < n_; ++s) {
      by_start_[static_cast<size_t>(s)].reserve(static_cast<size_t>(n_ - s));
      by_end_[static_cast<size_t>(s)].reserve(static_cast<size_t>(s + 1));
      first_entries_[static_cast<size_t>(s)].reserve(static_cast<size_t>(n_ - s));
    }
  }
  // The ranges of one length are independent: on the threads the caller gave LibTorch
  // (at::set_num_threads), each its own worker, where a length weighs enough candidates to pay for
  // them. Each range's values and choices are the same on any number of threads.
  workers_.assign(static_cast<size_t>(std::max(1, at::get_num_threads())), Worker{});
  constexpr int64_t kCandidatesPerThread = 1 << 14;
  for (int64_t length = 1; length <= n_; ++length) {
    if (length > 1 && !within_bounds(length - 1)) break;
    longest_ = length;
    // Each list is appended to by the one range that starts or ends at its stage.
    for (int64_t s = 0; s + length - 1 < n_; ++s) {
      by_start_[static_cast<size_t>(s)].emplace_back();
      by_end_[static_cast<size_t>(s + length - 1)].emplace_back();
      first_entries_[static_cast<size_t>(s)].emplace_back();
    }
    const int64_t grain = std::max<int64_t>(1, kCandidatesPerThread / (length + max_options_));
    at::parallel_for(0, n_ - length + 1, grain, [&](int64_t begin, int64_t end) {
      Worker& worker = workers_[static_cast<size_t>(at::get_thread_num()) % workers_.size()];
      for (int64_t s = begin; s < end; ++s) {
        size_t first = 0;
        const Window w = fill_range(s, s + length - 1, first, worker);
        by_start_[static_cast<size_t>(s)].back() = w;
        by_end_[static_cast<size_t>(s + length - 1)].back() = w;
        first_entries_[static_cast<size_t>(s)].back() = first;
      }
    });
  }
  rest_windows_.assign(static_cast<size_t>(n_), Window{});
  rest_first_entries_.assign(static_cast<size_t>(n_), 0);
  for (int64_t s = n_ - 1 - longest_; s >= 0; --s) {
    rest_windows_[static_cast<size_t>(s)] =
        fill_range(s, n_ - 1, rest_first_entries_[static_cast<size_t>(s)], workers_.front());
  }
  workers_ = {};
}

OptimalPlanner::Table::Table(CostTable costs, const PlannerOptions& options, int64_t max_budget_bytes,
                             bool refine_least, int64_t filled_units)
    : costs_(std::move(costs)), options_(options) {
  const auto start = std::chrono::steady_clock::now();
  costs_.check_well_formed("planner: the cost table");
  n_ = static_cast<int64_t>(costs_.stages.size());
  const int64_t memory_slots = options_.memory_slots();
  REMAT_CHECK(memory_slots >= 1 && memory_slots <= 100000, "planner: memory_slots must be in [1, 100000], got ",
              memory_slots, ".");
  plain_ = costs_.unchecked_plan(options_.mode());
  unchecked_ = simulate(plain_, costs_);
  // Twice the unchecked peak: with sizes rounded up to units, the unchecked plan itself needs
  // headroom to stay feasible.
  if (max_budget_bytes <= 0) max_budget_bytes = 2 * std::max<int64_t>(unchecked_.peak_bytes, 1);
  slots_ = memory_slots;
  unit_ = std::max<int64_t>(1, round_up(max_budget_bytes, slots_));
  filled_ = filled_units < 0 ? slots_ : std::min(filled_units, slots_);
  stages_ = to_units(costs_, unit_);
  for (const UnitStage& stage : stages_) {
    units_x_.push_back(stage.x);
    nograd_units_.push_back(stage.x + stage.nograd_extra);
    nograd_seconds_.push_back(stage.nograd_seconds);
  }
  segment_units_ = round_up(costs_.segment_bytes, unit_);
  reentrant_ = options_.mode() == CheckpointMode::reentrant;
  for (const auto& s : stages_) max_options_ = std::max<int32_t>(max_options_, static_cast<int32_t>(s.options.size()));
  // Subproblems that end before the last stage are the inside of a checkpointed segment (a segment
  // never ends at the end of its range, and the top level's rest always ends at n-1): there the
  // parameter gradients of stages already back-propagated are held until the segment returns.
  parameter_units_before_.assign(n_ + 1, 0);
  for (int64_t k = 0; k < n_; ++k) parameter_units_before_[k + 1] = parameter_units_before_[k] + stages_[k].parameters;
  fill_table();
  find_least_memory_plan();
  if (refine_least) refine_least_feasible_budget();
  fill_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The first slot where the whole chain is feasible (the table is monotone in m), and its plan's peak.
void OptimalPlanner::Table::find_least_memory_plan() {
  const Window& whole = window(0, n_ - 1);
  if (whole.empty()) return;
  min_units_ = whole.lo;
  least_memory_plan_ = plain_;
  least_memory_plan_.items.clear();
  build(0, n_ - 1, min_units_, least_memory_plan_.items, least_memory_plan_);
  least_feasible_bytes_ = simulate(least_memory_plan_, costs_).peak_bytes;
}

// Where this table's unit is coarse against the least peak (a budget far above it, or a chain of
// many small stages whose rounded-up sizes add up), tables spanning [0, 2·least] refine it until it
// stops falling: every result then means the same, the least budget within 0.2%.
void OptimalPlanner::Table::refine_least_feasible_budget() {
  int64_t unit = unit_;
  const int64_t default_span = 2 * std::max<int64_t>(unchecked_.peak_bytes, 1);
  if (least_feasible_bytes_ < 0 && unit_ * slots_ < default_span) {
    // A table for a budget below what any plan needs finds no plan at all: the least comes from a
    // table over the default range.
    const Table wide(costs_, options_, 0, /*refine_least=*/false);
    least_feasible_bytes_ = wide.least_feasible_bytes_;
    least_memory_plan_ = wide.least_memory_plan_;
    unit = wide.unit_;
  }
  for (int round = 0; round < 6 && least_feasible_bytes_ > 0 && unit * 500 > least_feasible_bytes_; ++round) {
    // Its least lies near half its span: filling the slots up to 60% of it is enough, and where it
    // is not (the whole chain infeasible there) the full table is filled.
    std::optional<Table> partial;
    partial.emplace(costs_, options_, 2 * least_feasible_bytes_, /*refine_least=*/false, slots_ * 3 / 5);
    if (partial->least_feasible_bytes_ < 0) partial.emplace(costs_, options_, 2 * least_feasible_bytes_, false);
    const Table& finer = *partial;
    if (finer.least_feasible_bytes_ <= 0 || finer.unit_ >= unit) break;
    const bool fell = finer.least_feasible_bytes_ < least_feasible_bytes_ - least_feasible_bytes_ / 100;
    if (finer.least_feasible_bytes_ < least_feasible_bytes_) {
      least_feasible_bytes_ = finer.least_feasible_bytes_;
      least_memory_plan_ = finer.least_memory_plan_;
    }
    unit = finer.unit_;
    if (!fell) break;
  }
}

void OptimalPlanner::Table::build(int64_t s, int64_t t, int64_t m, std::vector<PlanItem>& items, Plan& plan) const {
  // Along the range in a loop; only a segment's inside recurses (depth: the nesting, at most
  // longest_ levels).
  while (true) {
    const Window& w = window(s, t);
    TORCH_INTERNAL_ASSERT(!w.empty() && m >= w.lo, "planner: backtracking reached an infeasible state");
    m = std::min<int64_t>(m, w.hi);
    const int32_t choice = entries_.choices(first_entry(s, t))[m - w.lo];
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
    build(s, j - 1, m - 2 * segment_units_ - held_in_segment_units(j, t), inner, plan);
    items.push_back(PlanItem::checkpointed(std::move(inner)));
    m -= segment_units_ + round_up(costs_.stages[j - 1].output_bytes, unit_);
    s = j;
  }
}

double OptimalPlanner::Table::least_seconds(int64_t budget_bytes) const {
  return budget_bytes < 0 ? kInfinity : cost(0, n_ - 1, budget_bytes / unit_);
}

PlanResult OptimalPlanner::Table::plan(int64_t budget_bytes) const {
  const auto start = std::chrono::steady_clock::now();
  PlanResult result;
  result.planner = PlannerKind::optimal;
  result.name = to_string(PlannerKind::optimal);
  result.budget_bytes = budget_bytes;
  result.unchecked = unchecked_;
  result.least_feasible_budget_bytes = least_feasible_bytes_;
  result.timed_under = costs_.threads;
  // Sizes round up, so the budget's row holds a plan that fits; on a chain of many small stages the
  // rounding adds up, and rows above the budget's may hold faster plans that still fit in bytes:
  // step up by the slack the simulator finds while they do.
  int64_t first = budget_bytes < 0 ? -1 : std::min<int64_t>(budget_bytes / unit_, slots_);
  if (min_units_ >= 0 && first < min_units_ && budget_bytes >= least_feasible_bytes_) first = min_units_;
  for (int64_t m = first; m >= 0 && m <= slots_;) {
    if (cost(0, n_ - 1, m) == kInfinity) break;
    Plan plan = plain_;
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
  // The least-memory plan (refined below the grid) fits any budget of at least its peak.
  if (!result.feasible && least_feasible_bytes_ >= 0 && budget_bytes >= least_feasible_bytes_) {
    result.feasible = true;
    result.plan = least_memory_plan_;
    result.prediction = simulate(least_memory_plan_, costs_);
  }
  result.solve_seconds =
      fill_seconds_ + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

OptimalPlanner::OptimalPlanner(CostTable costs, const PlannerOptions& options, int64_t max_budget_bytes)
    : table_(std::make_shared<const Table>(std::move(costs), options, max_budget_bytes, /*refine_least=*/true)) {}
PlanResult OptimalPlanner::plan(int64_t budget_bytes) const { return table_->plan(budget_bytes); }
double OptimalPlanner::least_seconds(int64_t budget_bytes) const { return table_->least_seconds(budget_bytes); }
int64_t OptimalPlanner::least_feasible_budget_bytes() const { return table_->least_feasible_bytes_; }
const Plan& OptimalPlanner::least_memory_plan() const { return table_->least_memory_plan_; }
const Prediction& OptimalPlanner::unchecked() const { return table_->unchecked_; }
int64_t OptimalPlanner::unit_bytes() const { return table_->unit_; }
int64_t OptimalPlanner::max_segment_stages() const { return table_->longest_; }
double OptimalPlanner::fill_seconds() const { return table_->fill_seconds_; }

std::string to_string(PlannerKind kind) {
  switch (kind) {
    case PlannerKind::optimal:
      return "optimal";
    case PlannerKind::revolve:
      return "revolve";
    case PlannerKind::chen:
      return "chen";
    case PlannerKind::policy:
      return "policy";
    case PlannerKind::graph:
      return "graph";
  }
  return "unknown";
}

double PlanResult::predicted_overhead() const { return remat::predicted_overhead(prediction, unchecked); }

double PlanResult::predicted_overhead_spread() const { return remat::predicted_overhead_spread(prediction, unchecked); }

const PlanResult& PlanResult::ensure_feasible() const {
  if (feasible) return *this;
  const int64_t least = least_feasible_budget_bytes;
  // A share is told of the peak it was resolved against: the measured one where a step was run.
  const bool measured_share = measured_unchecked_peak_bytes > 0;
  const double unchecked_peak =
      static_cast<double>(std::max<int64_t>(measured_share ? measured_unchecked_peak_bytes : unchecked.peak_bytes, 1));
  const char* peak_name = measured_share ? "% of the measured unchecked peak" : "% of the predicted unchecked peak";
  REMAT_CHECK(least >= 0, name, " planner: no plan fits a budget of ", budget_bytes, " bytes (",
              format_bytes(budget_bytes), "), and none fits any budget: the chain's stages alone exceed what the ",
              "planner can hold. Plan a smaller model or batch.");
  REMAT_CHECK(measured_peak_bytes < 0, name, " planner: no plan measured within a budget of ", budget_bytes, " bytes (",
              format_bytes(budget_bytes), ") after ", replans, " re-plans (the last measured ",
              format_bytes(measured_peak_bytes), "): the least-memory plan measured ", least, " bytes (",
              format_bytes(least), ", ", std::round(1000.0 * static_cast<double>(least) / unchecked_peak) / 10.0,
              peak_name, "), the smallest budget measured feasible. Give at least that, or a ",
              "smaller model or batch.");
  REMAT_CHECK(false, name, " planner: no plan fits a budget of ", budget_bytes, " bytes (", format_bytes(budget_bytes),
              "): the smallest feasible budget is ", least, " bytes (", format_bytes(least), ", ",
              std::round(1000.0 * static_cast<double>(least) / unchecked_peak) / 10.0, peak_name,
              "). Give at least that, or a smaller model or batch.");
  return *this;
}

PlanResult plan_optimal(const CostTable& costs, const Budget& budget, const PlannerOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  costs.check_well_formed("plan_optimal: the cost table");
  const Prediction unchecked = simulate(costs.unchecked_plan(options.mode()), costs);
  const int64_t budget_bytes = budget.to_bytes(unchecked.peak_bytes);
  // The table spans [0, budget]: its memory unit is budget/slots, so rounding costs at most a slot
  // per term of the recurrence, relative to the budget asked for.
  const OptimalPlanner planner(costs, options, std::max<int64_t>(budget_bytes, 1));
  PlanResult result = planner.plan(budget_bytes);
  result.solve_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

int64_t least_feasible_budget(const CostTable& costs, const PlannerOptions& options) {
  return OptimalPlanner(costs, options).least_feasible_budget_bytes();
}

namespace {

// Which stages are the repeated chain: those of blocks, or every stage where the table names none.
std::vector<bool> block_stages(const CostTable& costs) {
  std::vector<bool> in_block;
  bool any = false;
  for (const auto& s : costs.stages) {
    in_block.push_back(s.block >= 0);
    any = any || s.block >= 0;
  }
  if (!any) in_block.assign(costs.stages.size(), true);
  return in_block;
}

// The mean of the block stages' costs, default option only (Revolve knows no stage options).
StageCost mean_block_stage(const CostTable& costs, const std::vector<bool>& in_block) {
  std::vector<const StageCost*> members;
  for (size_t i = 0; i < costs.stages.size(); ++i) {
    if (in_block[i]) members.push_back(&costs.stages[i]);
  }
  const double count = static_cast<double>(members.size());
  auto average = [&](auto getter) {
    double sum = 0;
    for (const StageCost* s : members) sum += static_cast<double>(getter(*s));
    return sum / count;
  };
  auto average_bytes = [&](auto getter) { return static_cast<int64_t>(std::ceil(average(getter))); };
  StageCost mean = *members.front();
  mean.output_bytes = average_bytes([](const StageCost& s) { return s.output_bytes; });
  mean.input_grad_bytes = average_bytes([](const StageCost& s) { return s.input_grad_bytes; });
  mean.parameter_bytes = average_bytes([](const StageCost& s) { return s.parameter_bytes; });
  mean.nograd_seconds = average([](const StageCost& s) { return s.nograd_seconds; });
  mean.recompute_extra_seconds = average([](const StageCost& s) { return s.recompute_extra_seconds; });
  mean.nograd_extra_bytes = average_bytes([](const StageCost& s) { return s.nograd_extra_bytes; });
  // The default option's costs, and where it ends a recomputed segment, each averaged.
  auto mean_run = [&](auto run_of) {
    StageRunCost r;
    r.forward_seconds = average([&](const StageCost& s) { return run_of(s).forward_seconds; });
    r.backward_seconds = average([&](const StageCost& s) { return run_of(s).backward_seconds; });
    r.kept_bytes = average_bytes([&](const StageCost& s) { return run_of(s).kept_bytes; });
    r.forward_extra_bytes = average_bytes([&](const StageCost& s) { return run_of(s).forward_extra_bytes; });
    r.backward_extra_bytes = average_bytes([&](const StageCost& s) { return run_of(s).backward_extra_bytes; });
    return r;
  };
  StageOptionCost o = members.front()->options.front();
  static_cast<StageRunCost&>(o) = mean_run([](const StageCost& s) -> const StageRunCost& { return s.options.front(); });
  o.graph_only = mean_run([](const StageCost& s) -> const StageRunCost& { return s.options.front().at_segment_end(); });
  mean.options = {o};
  return mean;
}

// A classic planner's result before it plans: its kind, the unchecked prediction and the budget.
PlanResult classic_result(PlannerKind kind, const CostTable& costs, const PlannerOptions& options,
                          const Budget& budget) {
  costs.check_well_formed(to_string(kind) + ": the cost table");
  PlanResult result;
  result.planner = kind;
  result.name = to_string(kind);
  result.unchecked = simulate(costs.unchecked_plan(options.mode()), costs);
  result.budget_bytes = budget.to_bytes(result.unchecked.peak_bytes);
  result.timed_under = costs.threads;
  return result;
}

}  // namespace

PlanResult revolve_plan(const CostTable& costs, const Budget& budget, const PlannerOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  PlanResult result = classic_result(PlannerKind::revolve, costs, options, budget);
  // The homogeneous model Revolve assumes: every block stage costs the mean block stage; stages
  // outside blocks (an embedding, a loss) keep their own costs.
  const std::vector<bool> in_block = block_stages(costs);
  CostTable uniform = costs;
  const StageCost mean = mean_block_stage(costs, in_block);
  for (size_t i = 0; i < uniform.stages.size(); ++i) {
    if (in_block[i]) {
      StageCost stage = mean;
      stage.name = costs.stages[i].name;
      stage.block = costs.stages[i].block;
      uniform.stages[i] = std::move(stage);
    }
    uniform.stages[i].options.resize(1);
  }
  const OptimalPlanner planner(uniform, options, std::max<int64_t>(result.budget_bytes, 1));
  if (!planner.least_memory_plan().items.empty()) {
    result.least_feasible_budget_bytes = simulate(planner.least_memory_plan(), costs).peak_bytes;
  }
  // The uniform chain misjudges the real one's peak: as a user of Revolve picks fewer snapshots
  // until the schedule fits, take the largest uniform budget whose plan, costed on the real chain,
  // fits the budget (one table answers every uniform budget; bisection, a few dozen backtracks).
  auto costed = [&](int64_t uniform_budget) {
    PlanResult on_real = planner.plan(uniform_budget);
    if (on_real.feasible) on_real.prediction = simulate(on_real.plan, costs);
    return on_real;
  };
  PlanResult chosen = costed(result.budget_bytes);
  if (chosen.feasible && chosen.prediction.peak_bytes > result.budget_bytes) {
    int64_t fits = -1, too_big = result.budget_bytes;
    for (int64_t low = std::max<int64_t>(planner.least_feasible_budget_bytes(), 0); low < too_big;) {
      const int64_t mid = low + (too_big - low) / 2;
      const PlanResult at_mid = costed(mid);
      if (at_mid.feasible && at_mid.prediction.peak_bytes <= result.budget_bytes) {
        fits = mid;
        low = mid + 1;
      } else {
        too_big = mid;
      }
    }
    if (fits >= 0) chosen = costed(fits);
  }
  if (chosen.feasible) {
    result.plan = chosen.plan;
    result.prediction = chosen.prediction;
    result.feasible = result.prediction.peak_bytes <= result.budget_bytes;
  }
  result.solve_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

PlanResult chen_greedy_plan(const CostTable& costs, const Budget& budget, const PlannerOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  PlanResult best = classic_result(PlannerKind::chen, costs, options, budget);
  const auto n = static_cast<int64_t>(costs.stages.size());
  const std::vector<bool> in_block = block_stages(costs);
  auto kept = [&costs](int64_t i) { return costs.stages[i].options.front().kept_bytes; };
  std::vector<int64_t> thresholds;  // candidates: kept bytes of every run of consecutive block stages
  for (int64_t a = 0; a < n; ++a) {
    int64_t sum = 0;
    for (int64_t b = a; b < n && in_block[b]; ++b) {
      sum += kept(b);
      thresholds.push_back(sum);
    }
  }
  std::sort(thresholds.begin(), thresholds.end());
  thresholds.erase(std::unique(thresholds.begin(), thresholds.end()), thresholds.end());
  for (int64_t threshold : thresholds) {
    Plan plan = costs.unchecked_plan(options.mode());
    plan.items.clear();
    std::vector<PlanItem> segment;
    int64_t running = 0;
    auto close_segment = [&] {
      if (!segment.empty()) plan.items.push_back(PlanItem::checkpointed(std::move(segment)));
      segment.clear();
      running = 0;
    };
    for (int64_t i = 0; i < n; ++i) {
      if (!in_block[i]) {  // outside the repeated chain: plain, and it ends a segment
        close_segment();
        plan.items.push_back(PlanItem::run(i));
        continue;
      }
      if (!segment.empty() && running + kept(i) > threshold) close_segment();
      segment.push_back(PlanItem::run(i));
      running += kept(i);
    }
    close_segment();
    const Prediction p = simulate(plan, costs);
    if (best.least_feasible_budget_bytes < 0 || p.peak_bytes < best.least_feasible_budget_bytes) {
      best.least_feasible_budget_bytes = p.peak_bytes;
    }
    if (p.peak_bytes <= best.budget_bytes && (!best.feasible || p.step_seconds < best.prediction.step_seconds)) {
      best.feasible = true;
      best.plan = std::move(plan);
      best.prediction = p;
    }
  }
  best.solve_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return best;
}

std::vector<PlanResult> compare_planners(const CostTable& costs, const Budget& budget,
                                         const std::vector<std::string>& policies,
                                         const std::function<Plan(const std::string&)>& build,
                                         const std::function<Prediction(const Plan&)>& predict,
                                         const PlannerOptions& options) {
  costs.check_well_formed("compare_planners: the cost table");
  const Prediction unchecked = simulate(costs.unchecked_plan(options.mode()), costs);
  const int64_t budget_bytes = budget.to_bytes(unchecked.peak_bytes);
  std::vector<PlanResult> out;
  for (const auto& name : policies) {
    PlanResult candidate;
    candidate.planner = PlannerKind::policy;
    candidate.name = name;
    candidate.budget_bytes = budget_bytes;
    candidate.unchecked = unchecked;
    try {
      candidate.plan = build(name);
    } catch (const c10::Error&) {
      continue;  // a policy that does not apply to this chain (segments:4 of 2 blocks) is no candidate
    }
    candidate.plan.mode = options.mode();
    try {
      candidate.prediction = predict(candidate.plan);
    } catch (const c10::Error&) {
      continue;  // nor is one whose options the table does not cost (sac, in a table profiled without it)
    }
    candidate.feasible = candidate.prediction.peak_bytes <= budget_bytes;
    candidate.least_feasible_budget_bytes = candidate.prediction.peak_bytes;  // its one plan's
    out.push_back(std::move(candidate));
  }
  const Budget exact = Budget::bytes(budget_bytes);
  out.push_back(revolve_plan(costs, exact, options));
  out.push_back(chen_greedy_plan(costs, exact, options));
  return out;
}

std::vector<PlanResult> compare_planners(const CostTable& costs, const Chain& chain, const Budget& budget,
                                         const PlannerOptions& options) {
  return compare_planners(
      costs, budget, generic_policy_candidates(),
      [&chain](const std::string& policy) { return policy_plan(policy, chain); },
      [&costs](const Plan& plan) { return simulate(plan, costs); }, options);
}

}  // namespace remat
