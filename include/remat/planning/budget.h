// remat/planning/budget.h — a memory budget for activations: absolute bytes, or a share of the unchecked peak.
//
//   remat::Budget::bytes(512 << 20)     remat::Budget::percent(50)     remat::Budget::fraction(0.5)
//   remat::Budget::parse("1.5GiB")      "50%"   (text converts implicitly: it says its unit)
//
// Integers do not convert: `PlanRequest::of_budget(50)` would have meant 50 bytes, so it does
// not compile; say Budget::bytes(50) or Budget::percent(50). A share is resolved against the
// unchecked plan's predicted activation peak when a planner knows it (to_bytes).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

namespace remat {

class Budget {
 public:
  /// The most bytes a budget may be: 2^53 (8 PiB), as any size in a cost table, so that no
  /// planner's arithmetic on it can overflow.
  static constexpr int64_t kMaxBytes = int64_t{1} << 53;

  /// `bytes` of activation memory, from 0 to kMaxBytes.
  static Budget bytes(int64_t bytes);
  /// `percent` of the unchecked activation peak, in (0, 1000].
  static Budget percent(double percent);
  /// `fraction` of the unchecked activation peak, in (0, 10].
  static Budget fraction(double fraction);
  /// "512MiB", "1.5GiB", "800KiB", "300000B", "123456" (bytes) or "50%": a decimal number (digits,
  /// optionally a fraction and an exponent: 1.5, 2e9) then at once the unit. A clear error for
  /// anything else ("12parsecs", "", "1e400", "0x10MiB", " 50%", "-0", "1e-5": less than a byte).
  static Budget parse(const std::string& text);

  Budget(const char* text) : Budget(parse(text == nullptr ? std::string() : std::string(text))) {}  // NOLINT
  Budget(const std::string& text) : Budget(parse(text)) {}                                          // NOLINT
  /// No integer conversion: the unit would be a guess (see the top of this header).
  template <typename Integer, typename = std::enable_if_t<std::is_arithmetic<Integer>::value>>
  Budget(Integer) = delete;

  /// The budget in bytes, a share taken of `unchecked_peak_bytes`; a clear error when that share
  /// is beyond kMaxBytes or the peak is negative.
  int64_t to_bytes(int64_t unchecked_peak_bytes) const;
  /// True for a share of the unchecked peak ("50%"), false for bytes.
  bool is_relative() const { return relative_; }
  /// As a user would write it: "50%", "536870912" (bytes) or the text it was parsed from.
  const std::string& text() const { return text_; }

 private:
  Budget(bool relative, double share, int64_t bytes, std::string text)
      : relative_(relative), share_(share), bytes_(bytes), text_(std::move(text)) {}
  bool relative_ = false;
  double share_ = 0;   // of the unchecked peak (0.5 for 50%), when relative
  int64_t bytes_ = 0;  // exact (a double would round 2^63 - 1 up, out of int64), when not
  std::string text_;
};

}  // namespace remat
