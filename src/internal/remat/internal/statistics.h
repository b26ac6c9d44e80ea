// remat/internal/statistics.h — the one median remat's measurements use (times of repeated runs),
// its spread and interval, and the micro-benchmarks' per-call timer.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>
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

/// The half-width of an approximate 95% interval of the median of `values`: twice its standard
/// error from the median absolute deviation (robust to the one slow run a shared machine gives);
/// 0 for fewer than two values. Below six values the deviation is taken from the range as well,
/// whichever is wider: the MAD of three values is the nearer neighbour's distance from the median,
/// so two of three runs that land close would call a stage scattered over 0-40 ms pinned down.
inline double median_spread(const std::vector<double>& values) {
  if (values.size() < 2) return 0.0;
  const double centre = median(values);
  std::vector<double> deviations;
  deviations.reserve(values.size());
  for (const double v : values) deviations.push_back(std::abs(v - centre));
  // 1.4826: MAD to standard deviation (normal); 1.253: the median's standard error over the mean's.
  double deviation = 1.4826 * median(deviations);
  if (values.size() < 6) {
    // The expected range of n normal values over their standard deviation (d2 of quality control).
    static constexpr double range_over_deviation[] = {0, 0, 1.128, 1.693, 2.059, 2.326};
    const auto [low, high] = std::minmax_element(values.begin(), values.end());
    deviation = std::max(deviation, (*high - *low) / range_over_deviation[values.size()]);
  }
  return 2 * 1.253 * deviation / std::sqrt(static_cast<double>(values.size()));
}

/// A distribution-free interval of the median of `values` (order statistics, about 95%: the
/// extremes for fewer than six values); {0, 0} when empty.
inline std::pair<double, double> median_interval(std::vector<double> values) {
  if (values.empty()) return {0.0, 0.0};
  std::sort(values.begin(), values.end());
  const double n = static_cast<double>(values.size());
  const auto k = static_cast<size_t>(std::max(0.0, std::floor((n - 1.96 * std::sqrt(n)) / 2)));
  return {values[k], values[values.size() - 1 - k]};
}

/// Seconds per call of `f`, over `calls` calls in a row (the micro-benchmarks' timer).
template <typename F>
double seconds_per_call(int calls, F&& f) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls;
}

}  // namespace remat
