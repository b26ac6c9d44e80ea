#include "remat/planning/budget.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "remat/base/error.h"

namespace remat {
namespace {

const char* const kBudgetForms =
    "; write it as bytes (123456 or 123456B), with a unit (800KiB, 512MiB, 1.5GiB) or as "
    "a percentage of the unchecked activation peak (50%).";

std::string number_text(double value) {
  std::ostringstream os;
  os << value;
  return os.str();
}

}  // namespace

Budget Budget::bytes(int64_t bytes) {
  REMAT_CHECK(bytes >= 0, "a budget in bytes must not be negative, got ", bytes, ".");
  return Budget(false, static_cast<double>(bytes), std::to_string(bytes));
}

Budget Budget::percent(double percent) {
  REMAT_CHECK(std::isfinite(percent) && percent > 0 && percent <= 1000,
              "a budget's percentage must be in (0, 1000], got ", percent, ".");
  return Budget(true, percent / 100.0, number_text(percent) + "%");
}

Budget Budget::fraction(double fraction) {
  REMAT_CHECK(std::isfinite(fraction) && fraction > 0 && fraction <= 10,
              "a budget's fraction of the unchecked peak must be in (0, 10], got ", fraction, ".");
  return Budget(true, fraction, number_text(100 * fraction) + "%");
}

Budget Budget::parse(const std::string& text) {
  REMAT_CHECK(!text.empty(), "the budget is empty", kBudgetForms);
  const std::string echoed = text.size() > 40 ? text.substr(0, 37) + "..." : text;  // it may be 100,000 digits
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::out_of_range&) {
    REMAT_CHECK(false, "budget '", echoed, "' is out of range", kBudgetForms);
  } catch (const std::exception&) {
    REMAT_CHECK(false, "budget '", echoed, "' does not start with a number", kBudgetForms);
  }
  REMAT_CHECK(std::isfinite(value), "budget '", echoed, "' is not a finite number", kBudgetForms);
  const std::string unit = text.substr(used);
  if (unit == "%") {
    REMAT_CHECK(value > 0 && value <= 1000, "budget '", echoed, "': a percentage must be in (0, 1000].");
    return Budget(true, value / 100.0, text);
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
    REMAT_CHECK(false, "budget '", echoed, "' has an unknown unit '",
                unit.size() > 20 ? unit.substr(0, 17) + "..." : unit, "'", kBudgetForms);
  }
  const double bytes = value * scale;
  REMAT_CHECK(bytes >= 0 && bytes < 9.0e18, "budget '", echoed, "' is out of range", kBudgetForms);
  return Budget(false, std::floor(bytes), text);
}

int64_t Budget::to_bytes(int64_t unchecked_peak_bytes) const {
  if (!relative_) return static_cast<int64_t>(value_);
  const double bytes = value_ * static_cast<double>(unchecked_peak_bytes);
  REMAT_CHECK(bytes >= 0 && bytes < 9.0e18, "budget '", text_, "' of an unchecked peak of ", unchecked_peak_bytes,
              " bytes is out of range.");
  return static_cast<int64_t>(bytes);
}

}  // namespace remat
