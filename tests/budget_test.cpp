// remat/planning/budget.h: budgets say their unit; what is not a decimal number of bytes or a share is refused.
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/planning/budget.h"
#include "support/compare.h"

TEST(Planner, ParsesBudgets) {
  EXPECT_EQ(remat::Budget::parse("1024").to_bytes(0), 1024);
  EXPECT_EQ(remat::Budget::parse("2KiB").to_bytes(0), 2048);
  EXPECT_EQ(remat::Budget::parse("1.5MiB").to_bytes(0), 1572864);
  EXPECT_EQ(remat::Budget::parse("1GiB").to_bytes(0), int64_t{1} << 30);
  EXPECT_EQ(remat::Budget::parse("50%").to_bytes(1000), 500);
  for (const std::string bad : {"", "MiB", "12 parsecs", "5TB", "-3%"}) {
    try {
      remat::Budget::parse(bad).to_bytes(1000);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find("budget"), std::string::npos);
    }
  }
  // A 100,000-digit budget is refused without echoing it whole; 1e400 is out of range, not "not a number".
  const std::string digits =
      remat::testing::error_of([] { remat::Budget::parse(std::string(100000, '9')).to_bytes(100); });
  EXPECT_NE(digits.find("is out of range"), std::string::npos) << digits.substr(0, 200);
  EXPECT_LT(digits.size(), 400u);
  REMAT_EXPECT_ERROR(remat::Budget::parse("1e400").to_bytes(100), "budget '1e400' is out of range");
}

// Issue 39: hexadecimal, leading blanks, a sign and less than a byte were read as budgets (std::stod
// takes them all), and Budget::bytes(INT64_MAX) came back negative through a double.
TEST(Budget, RefusesWhatIsNotADecimalNumberOfBytesAndOverflow) {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"0x10MiB", "budget '0x10MiB' is hexadecimal; write the number in decimal"},
      {" \t50%", "budget ' \\t50%' does not start with a decimal number"},
      {"-0", "budget '-0' does not start with a decimal number"},
      {"+5MiB", "budget '+5MiB' does not start with a decimal number"},
      {"1e-5", "budget '1e-5' is less than one byte; give 0 or at least 1 byte"},
      {"1e-400", "budget '1e-400' is less than one byte"},
      {"0.5", "budget '0.5' is less than one byte"},
      {"1.MiB", "budget '1.MiB' does not start with a decimal number"},
      {"inf", "budget 'inf' does not start with a decimal number"},
      {"nan%", "budget 'nan%' does not start with a decimal number"},
      {"9PiB", "budget '9PiB' has an unknown unit 'PiB'"},
      {"9000000GiB", "budget '9000000GiB' is out of range: at most 2^53 bytes (8 PiB)"},
      {"5\xc2\x9b", "budget '5\\u009b' has an unknown unit '\\u009b'"}};
  for (const auto& [text, expected] : refused) {
    const std::string message = remat::testing::error_of([&] { remat::Budget::parse(text); });
    EXPECT_NE(message.find(expected), std::string::npos) << "'" << text << "': " << message;
    EXPECT_NE(message.find("write it as bytes (123456 or 123456B)"), std::string::npos)
        << "'" << text << "' is refused without the accepted forms: " << message;
  }
  EXPECT_EQ(remat::Budget::parse("0").to_bytes(100), 0);
  EXPECT_EQ(remat::Budget::parse("1e3").to_bytes(0), 1000);
  EXPECT_EQ(remat::Budget::parse("8192GiB").to_bytes(0), int64_t{1} << 43);
  EXPECT_EQ(remat::Budget::parse("0.3KiB").to_bytes(0), 307);

  // Exact to 2^53 bytes, and refused beyond it, absolute or a share of a peak alike.
  EXPECT_EQ(remat::Budget::bytes(remat::Budget::kMaxBytes).to_bytes(0), remat::Budget::kMaxBytes);
  EXPECT_EQ(remat::Budget::bytes(remat::Budget::kMaxBytes - 1).to_bytes(0), remat::Budget::kMaxBytes - 1);
  REMAT_EXPECT_ERROR(remat::Budget::bytes(INT64_MAX),
                     "a budget in bytes must be at most 2^53 (8 PiB), got 9223372036854775807");
  REMAT_EXPECT_ERROR(remat::Budget::percent(1000).to_bytes(INT64_MAX), "bytes, out of range: at most 2^53 (8 PiB)");
  REMAT_EXPECT_ERROR(remat::Budget::parse("50%").to_bytes(-1), "must not be negative, got -1 bytes");
  EXPECT_EQ(remat::Budget::percent(50).to_bytes(int64_t{1} << 53), int64_t{1} << 52);
}

TEST(Budget, SaysItsUnitAndIntegersDoNotConvert) {
  static_assert(!std::is_convertible<int, remat::Budget>::value, "an integer budget's unit would be a guess");
  static_assert(!std::is_convertible<int64_t, remat::Budget>::value, "an integer budget's unit would be a guess");
  static_assert(std::is_convertible<const char*, remat::Budget>::value, "text says its unit");
  EXPECT_EQ(remat::Budget::bytes(1234).to_bytes(1 << 20), 1234);
  EXPECT_FALSE(remat::Budget::bytes(1234).is_relative());
  EXPECT_EQ(remat::Budget::percent(25).to_bytes(1000), 250);
  EXPECT_EQ(remat::Budget::fraction(0.25).to_bytes(1000), 250);
  EXPECT_TRUE(remat::Budget::fraction(0.25).is_relative());
  EXPECT_EQ(remat::Budget::percent(25).text(), "25%");
  EXPECT_EQ(remat::Budget("2KiB").to_bytes(0), 2048);
  REMAT_EXPECT_ERROR(remat::Budget::bytes(-1), "must not be negative");
  REMAT_EXPECT_ERROR(remat::Budget::percent(0), "percentage must be in (0, 1000]");
  REMAT_EXPECT_ERROR(remat::Budget::fraction(std::nan("")), "must be in (0, 10]");
}
