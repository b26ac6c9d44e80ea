// Internal: one training step as recorded for planning over its graph — the forward's operator
// calls (what each read and made, how long it took, what the allocator held after it), the tensors
// autograd saved, and the backward's use and release of them — and what plans and runs on it.
//
// Words: a *value* is a tensor a call made (an output; a call that writes an argument makes a new
// value of it). A *storage* is memory values share (a view's value shares its base's). Plans keep
// or drop storages: a dropped storage's saved tensors are rebuilt in backward by replaying the calls
// that made them, from kept storages and tensors from outside the step.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

namespace remat::detail {

// Where a call's tensor argument (or result) sits, and which value it is.
struct TensorSlot {
  uint32_t position = 0;  // among the call's arguments (results)
  int32_t element = -1;   // in a list; -1: the argument itself
  int64_t value = -1;     // made by the step (the value it was when read); -1: from outside the step
  bool written = false;   // the call changes it in place
  bool stale = false;     // its storage was written in place after the value was made: a replay would
                          // read it as it was made, not as this call read it
};

struct RecordedCall {
  std::optional<c10::OperatorHandle> op;
  std::string name;                    // "aten::mm.default" style: name and overload
  std::vector<c10::IValue> arguments;  // tensors left out (undefined): `slots` says where they come from
  std::vector<TensorSlot> slots;
  std::vector<TensorSlot> results;  // value >= 0 for every defined tensor result
  bool random = false;
  std::string not_replayable;  // why a replay may never run it; empty: it may
  double seconds = 0;
  int64_t bytes_after = 0;  // the allocator's bytes after the call, above those before the forward
  int64_t peak = 0;         // the most it held since the previous call ended, up to this one's end
};

struct RecordedValue {
  int64_t call = 0;
  int64_t storage = 0;
  int64_t storage_writes = 0;  // in-place writes to the storage before this value was made
  std::vector<int64_t> sizes;
  at::ScalarType dtype = at::kFloat;
  int64_t last_read = -1;  // the last call that read it; -1: none
};

struct RecordedStorage {
  int64_t bytes = 0;           // 0 for memory from outside the step (a view of a parameter)
  bool outside = false;        // the memory is not the step's (a view of a tensor from outside)
  int64_t writes = 0;          // in-place writes by the step's calls
  int64_t last_value = 0;      // its newest value
  int64_t dies_after = 0;      // the last call before the program dropped its last tensor on it: where
                               // the forward frees it when autograd does not save it
  std::vector<int64_t> saved;  // the saved entries on it
};

// One tensor autograd saved (one call of the pack hook), in the order saved.
struct SavedEntry {
  int64_t value = -1;    // the storage's newest value when saved; -1: a tensor from outside the step
  int64_t storage = -1;  // -1 with value
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  at::ScalarType dtype = at::kFloat;
};

struct BackwardEvent {
  bool unpack = true;  // else: autograd released the entry
  int64_t entry = 0;
  int64_t bytes = 0;  // the allocator's bytes as it happened, above those before the forward
  int64_t peak = 0;   // the most it held since the previous event (or the forward's end)
};

struct RecordedStep {
  std::vector<RecordedCall> calls;
  std::vector<RecordedValue> values;
  std::vector<RecordedStorage> storages;
  std::vector<SavedEntry> saved;
  std::vector<BackwardEvent> backward;
  c10::Device device = c10::kCPU;
  int64_t measured_peak = 0;    // above the bytes before the forward, forward and backward
  int64_t released = 0;         // entries autograd released: the backward is complete at saved.size()
  int64_t rng_state_bytes = 0;  // what saving the RNG's state for a replayed random call holds
  double forward_seconds = 0;
  double step_seconds = 0;  // forward start to the last release

  bool complete() const { return !saved.empty() && released == static_cast<int64_t>(saved.size()); }
};

// Which storages a plan drops, and what follows from it for running it.
struct StepDrops {
  std::vector<bool> dropped;  // per storage
  // A replay keeps every dropped tensor it rebuilt that a later unpack asks for (a segment's
  // recompute, once), or only the one asked for (later unpacks replay again: less memory, more time).
  bool keep_rebuilt = true;
};

// Per dropped entry, what rebuilding it replays, derived from a plan.
struct Rebuilds {
  std::vector<std::vector<int64_t>> calls_of;    // per entry: the calls to replay, in order (empty: kept)
  std::vector<std::vector<int64_t>> sources_of;  // per entry: kept values the replay reads
  std::vector<bool> replayed;                    // per call: in some entry's replay
  std::vector<bool> source;                      // per value: read by some replay
  std::string failure;                           // why some dropped entry cannot be rebuilt; empty: all can
};

// The calls rebuilding each dropped entry needs, back to kept values and tensors from outside.
Rebuilds rebuilds_of(const RecordedStep& step, const StepDrops& drops);

// For a replay of `calls` (in order): after each, the storages made by the replay that no later
// call of it reads, for the replay to let go of unless it keeps them for later unpacks.
std::vector<std::vector<int64_t>> storages_done_after(const RecordedStep& step, const std::vector<int64_t>& calls);

struct Simulation {
  int64_t peak = 0;          // predicted, above the bytes before the forward (calibrated on the record)
  int64_t forward_peak = 0;  // the same, over the forward alone
  double recompute_seconds = 0;
  double excess = 0;  // bytes over the budget summed over the walk's samples: how far from fitting
  bool feasible = false;
  std::string failure;
};

// Walks the recorded forward and backward under `drops` as the runtime would run them.
Simulation simulate(const RecordedStep& step, const StepDrops& drops,
                    int64_t budget_bytes = std::numeric_limits<int64_t>::max());

struct GraphPlanChoice {
  StepDrops drops;
  Simulation simulation;
  Simulation unchecked;
  int64_t candidates = 0;  // storages that may be dropped
  std::string search;      // which search found it: "every subset", "cut program", "greedy, from keeping all", ...
};

// The plan of least predicted recompute time whose predicted peak is at most `budget_bytes`: every
// subset of the droppable storages when they are few (exact), else the best of the cut program's
// plan (the chain dynamic program over the execution order: segments' boundaries kept, their
// insides dropped) and greedy searches from keeping all (and, where that fails, from dropping all),
// each improved by keeping again what saves time. Throws, with the lowest peak found, when none fits.
enum class PlanSearch {
  automatic,
  exact,
  greedy,    // the greedy searches only
  segments,  // the cut program only
  heuristic  // both, whatever the number of candidates
};
GraphPlanChoice plan_drops(const RecordedStep& step, int64_t budget_bytes, PlanSearch search = PlanSearch::automatic);

}  // namespace remat::detail
