// remat/internal/statistics.h — the one median remat's measurements use (times of repeated runs),
// and the micro-benchmarks' per-call timer.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace remat {

/// The median of `values` (the mean of the middle two for an even count); 0 when empty.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  if (values.size() % 2 == 1) return values[mid];
  const double upper = values[mid];
  return 0.5 * (*std::max_element(values.begin(), values.begin() + mid) + upper);
}

/// Seconds per call of `f`, over `calls` calls in a row (the micro-benchmarks' timer).
template <typename F>
double seconds_per_call(int calls, F&& f) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls;
}

}  // namespace remat
