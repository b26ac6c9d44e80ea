// The keep decisions of remat's regenerated dropout: element i of a stream keyed by `seed` is kept
// when the i-th 32-bit output of Philox4x32-10 is at least p·2³². Element i is lane i % 4 of the
// counter i / 4, so any run of elements can be drawn on its own, in any order and by any thread.
//
// Two ways to draw them, bitwise alike: a loop over ATen's engine for CPU tensors (fast there), and
// tensor operations for any other device (keep_decisions), so that a GPU draws its masks itself
// instead of receiving them from the host.
#pragma once

#include <cmath>
#include <cstdint>

#include <ATen/core/PhiloxRNGEngine.h>
#include <ATen/core/Tensor.h>

#include "remat/base/error.h"

namespace remat::ops::detail {

inline uint64_t keep_threshold(double p) {
  REMAT_CHECK(p >= 0.0 && p < 1.0, "dropout: the probability must be in [0, 1), got ", p, ".");
  return static_cast<uint64_t>(std::llround(p * 4294967296.0));
}

/// Calls keep(i, kept) for the elements first .. first + n - 1 of the stream, in order.
template <typename Keep>
inline void for_each_keep(uint64_t seed, uint64_t first, int64_t n, uint64_t threshold, Keep&& keep) {
  at::philox_engine engine(seed, /*subsequence=*/0, /*offset=*/first / 4);
  for (uint64_t skip = first % 4; skip > 0; --skip) engine();
  for (int64_t i = 0; i < n; ++i) keep(i, engine() >= threshold);
}

/// data[i] *= kept ? scale : 0 for the elements first .. first + n - 1 of the stream.
template <typename T>
inline void apply_keep(T* data, uint64_t seed, uint64_t first, int64_t n, uint64_t threshold, T scale) {
  for_each_keep(seed, first, n, threshold, [&](int64_t i, bool kept) { data[i] = kept ? data[i] * scale : T(0); });
}

/// The stream's 32-bit outputs (in an int64 tensor) at the elements starts[r] + j, j in [0, length),
/// for each row r of `starts` (int64, one dimension, values below 2⁶²): (rows, length) on starts'
/// device, computed by tensor operations only. Philox's 32-bit multiplies are emulated exactly in
/// int64 arithmetic. Transients take about 32 bytes per element; keep_decisions bounds them.
at::Tensor philox_outputs(uint64_t seed, const at::Tensor& starts, int64_t length);

/// The keep decisions (bool, (rows, length)) of philox_outputs, drawn in groups of rows so that
/// transients stay below ~16 MiB whatever the size.
at::Tensor keep_decisions(uint64_t seed, const at::Tensor& starts, int64_t length, uint64_t threshold);

/// Whether the masks of `t` are drawn by keep_decisions on t's device rather than by the CPU loop:
/// for every tensor not on the CPU, and for CPU tensors while a ForceTensorKeepPath lives.
bool keeps_by_tensor_ops(const at::Tensor& t);

/// For tests: while alive (on any thread), CPU tensors take the device path too, so that it is
/// checked against the CPU loop, bitwise, on a machine without a GPU.
class ForceTensorKeepPath {
 public:
  ForceTensorKeepPath();
  ~ForceTensorKeepPath();
  ForceTensorKeepPath(const ForceTensorKeepPath&) = delete;
  ForceTensorKeepPath& operator=(const ForceTensorKeepPath&) = delete;
};

}  // namespace remat::ops::detail
