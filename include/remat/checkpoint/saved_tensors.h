// remat/checkpoint/saved_tensors.h — what a forward saves for its backward, seen from outside, for
// code that measures what checkpointing a function costs (the profiler, a user's own cost model):
//
//   size_t saved = remat::count_saved_tensors([&] { y = block(x); });
//   remat::run_without_saving([&] { y = block(x); });   // as a checkpoint's recording forward runs
//   auto kept = remat::run_until_saved([&] { block(x); }, saved);  // as a non-reentrant recompute stops
//
// Each runs `forward` on this thread with LibTorch's saved-tensor hooks set for its duration
// (remat's autograd engine answers them from C++). None keeps the saved tensors in the graph:
// back-propagating a graph recorded under them is an error naming remat.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace remat {

/// How many tensors `forward`'s operations save for their backward.
size_t count_saved_tensors(const std::function<void()>& forward);

/// Runs `forward` recording its graph but keeping none of the tensors its operations save: what a
/// checkpoint's first, recording forward holds.
void run_without_saving(const std::function<void()>& forward);

/// Runs `forward` until its operations have saved `count` tensors, then abandons it (the rest of
/// `forward` does not run), and returns those tensors: what a non-reentrant recompute hands to the
/// backward when it stops early. `count` 0 runs nothing; a forward saving fewer runs to its end.
std::vector<at::Tensor> run_until_saved(const std::function<void()>& forward, size_t count);

}  // namespace remat
