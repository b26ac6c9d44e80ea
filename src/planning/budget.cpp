#include "remat/planning/budget.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "remat/base/error.h"

namespace remat {
namespace {

const char* const kBudgetForms =
    "; write it as bytes (123456 or 123456B), with a unit right after the number (800KiB, 512MiB, 1.5GiB) or "
    "as a percentage of the unchecked activation peak (50%): a decimal number without sign, spaces or "
    "hexadecimal.";

std::string number_text(double value) {
  std::ostringstream os;
  os << value;
  return os.str();
}

// The length of the decimal number at the start of `text` (digits, then optionally '.' and digits,
// then optionally e, a sign and digits), or 0 when it does not start with one: std::stod alone
// would also skip spaces and take a sign, hexadecimal (0x10), inf and nan.
size_t decimal_number_length(const std::string& text) {
  const auto digits_from = [&](size_t at) {
    size_t end = at;
    while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
    return end;
  };
  size_t end = digits_from(0);
  if (end == 0) return 0;
  if (end < text.size() && text[end] == '.') {
    const size_t fraction = digits_from(end + 1);
    if (fraction == end + 1) return 0;  // "1." or "1.MiB"
    end = fraction;
  }
  if (end < text.size() && (text[end] == 'e' || text[end] == 'E')) {
    size_t at = end + 1;
    if (at < text.size() && (text[at] == '+' || text[at] == '-')) ++at;
    const size_t exponent = digits_from(at);
    if (exponent == at) return 0;  // "1e" or "1eMiB"
    end = exponent;
  }
  return end;
}

std::string out_of_range(const std::string& text) {
  return "budget " + printable(text, 40) + " is out of range: at most 2^53 bytes (8 PiB)";
}

}  // namespace

Budget Budget::bytes(int64_t bytes) {
  REMAT_CHECK(bytes >= 0, "a budget in bytes must not be negative, got ", bytes, ".");
  REMAT_CHECK(bytes <= kMaxBytes, "a budget in bytes must be at most 2^53 (8 PiB), got ", bytes,
              "; no larger size can be planned for without overflow.");
  return Budget(false, 0, bytes, std::to_string(bytes));
}

Budget Budget::percent(double percent) {
  REMAT_CHECK(std::isfinite(percent) && percent > 0 && percent <= 1000,
              "a budget's percentage must be in (0, 1000], got ", percent, ".");
  return Budget(true, percent / 100.0, 0, number_text(percent) + "%");
}

Budget Budget::fraction(double fraction) {
  REMAT_CHECK(std::isfinite(fraction) && fraction > 0 && fraction <= 10,
              "a budget's fraction of the unchecked peak must be in (0, 10], got ", fraction, ".");
  return Budget(true, fraction, 0, number_text(100 * fraction) + "%");
}

Budget Budget::parse(const std::string& text) {
  REMAT_CHECK(!text.empty(), "the budget is empty", kBudgetForms);
  const std::string echoed = printable(text, 40);  // it may be 100,000 digits, or hold control bytes
  REMAT_CHECK(text.rfind("0x", 0) != 0 && text.rfind("0X", 0) != 0, "budget ", echoed,
              " is hexadecimal; write the number in decimal", kBudgetForms);
  const size_t used = decimal_number_length(text);
  REMAT_CHECK(used > 0, "budget ", echoed, " does not start with a decimal number", kBudgetForms);
  const std::string number = text.substr(0, used);
  errno = 0;
  const double value = std::strtod(number.c_str(), nullptr);
  // ERANGE: beyond a double (1e400, 100,000 nines) or below the smallest one (1e-400, not zero).
  const bool underflow = errno == ERANGE && value < 1;
  REMAT_CHECK(std::isfinite(value) && (errno != ERANGE || underflow), out_of_range(text), kBudgetForms);
  const std::string unit = text.substr(used);
  if (unit == "%") {
    REMAT_CHECK(!underflow && value > 0 && value <= 1000, "budget ", echoed, ": a percentage must be in (0, 1000].");
    return Budget(true, value / 100.0, 0, text);
  }
  double scale = 0;
  if (unit.empty() || unit == "B") {
    scale = 1;
  } else if (unit == "KiB" || unit == "K") {
    scale = 1024.0;
  } else if (unit == "MiB" || unit == "M") {
    scale = 1024.0 * 1024.0;
  } else if (unit == "GiB" || unit == "G") {
    scale = 1024.0 * 1024.0 * 1024.0;
  } else {
    REMAT_CHECK(false, "budget ", echoed, " has an unknown unit ", printable(unit, 20), kBudgetForms);
  }
  const double bytes = value * scale;
  REMAT_CHECK(bytes <= static_cast<double>(kMaxBytes), out_of_range(text), kBudgetForms);
  // 0 is a budget (nothing fits); a positive number that is not one byte is a mistake (1e-5).
  REMAT_CHECK(!underflow && (bytes == 0 || bytes >= 1), "budget ", echoed,
              " is less than one byte; give 0 or at least 1 byte", kBudgetForms);
  return Budget(false, 0, static_cast<int64_t>(std::floor(bytes)), text);
}

int64_t Budget::to_bytes(int64_t unchecked_peak_bytes) const {
  if (!relative_) return bytes_;
  REMAT_CHECK(unchecked_peak_bytes >= 0, "budget '", text_, "': the unchecked peak it is a share of must not be ",
              "negative, got ", unchecked_peak_bytes, " bytes.");
  const double bytes = share_ * static_cast<double>(unchecked_peak_bytes);
  REMAT_CHECK(bytes <= static_cast<double>(kMaxBytes), "budget '", text_, "' of an unchecked peak of ",
              unchecked_peak_bytes, " bytes is ", number_text(bytes), " bytes, out of range: at most 2^53 (8 PiB).");
  return static_cast<int64_t>(bytes);
}

}  // namespace remat
