// Internal: reading remat's JSON files (plans, cost tables) so that every malformed input gets an
// error naming the file and the field and saying what was expected, never nlohmann-json's own
// exception (its type_error would name neither). Sizes are checked as absurd beyond 2^53 bytes,
// so sums of them cannot overflow.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace remat::detail {

/// 2^53 bytes (8 PiB): no size a profile or plan can hold honestly is larger, and sums of a table's
/// sizes stay exact in a double and far from int64 overflow.
constexpr int64_t kMaxBytes = int64_t{1} << 53;
/// What a size and a time must be, in the words of every error about one (read from a file or
/// built in code: CostTable::check_well_formed).
constexpr const char* kBytesExpected = "a whole number of bytes from 0 to 2^53 (8 PiB)";
constexpr const char* kSecondsExpected = "a number of seconds, at least 0";

/// Parses `text` as JSON, refusing (naming `source`) invalid text and documents nesting deeper than
/// `max_depth` (checked without recursion); `expected` says what the file should be.
nlohmann::json parse_json_document(const std::string& text, const std::string& source, int64_t max_depth,
                                   const std::string& expected);

/// True when some value of `root` lies deeper than `limit` (an iterative walk).
bool json_deeper_than(const nlohmann::json& root, int64_t limit);

/// A JSON syntax error in remat's words: where and what ("at line 1, column 5: unexpected end of
/// input; ..."), without nlohmann's exception id.
std::string describe_parse_error(const nlohmann::json::exception& error);

/// A value for an error message: short, and without serialising a deep value recursively.
std::string describe_json(const nlohmann::json& value);

/// `text` cut to `most` characters with "..." (names from a file, echoed in an error).
std::string shortened(const std::string& text, size_t most = 80);

/// The fields of one JSON object; `where` names it in errors ("costs.json: stages[3]").
class JsonFields {
 public:
  JsonFields(const nlohmann::json& value, std::string where);

  bool has(const char* key) const { return object_.contains(key); }
  const nlohmann::json& array(const char* key) const;
  std::string string(const char* key) const;
  std::string string_or(const char* key, const std::string& fallback) const;
  int64_t integer_or(const char* key, int64_t fallback) const;
  /// An integer that fits int64 (a number of bytes): its range, [0, kMaxBytes], is the reader's
  /// to check (CostTable::check_well_formed checks tables read and built alike).
  int64_t bytes(const char* key) const;
  int64_t bytes_or(const char* key, int64_t fallback) const;
  /// A number (of seconds): that it is finite and at least 0 is the reader's to check, as above.
  double seconds(const char* key) const;
  const std::string& where() const { return where_; }

 private:
  const nlohmann::json& field(const char* key) const;
  const nlohmann::json& object_;
  std::string where_;
};

}  // namespace remat::detail
