// The keep decisions of remat's regenerated dropout: element i of a stream keyed by `seed` is kept
// when the i-th 32-bit output of Philox4x32-10 is at least p·2³². Element i is lane i % 4 of the
// counter i / 4, so any run of elements can be drawn on its own, in any order and by any thread.
#pragma once

#include <cmath>
#include <cstdint>

#include <ATen/core/PhiloxRNGEngine.h>

#include "remat/error.h"

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

}  // namespace remat::ops::detail
