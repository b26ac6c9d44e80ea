#include "base/json_fields.h"

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "remat/base/error.h"
#include "base/json_nesting.h"

namespace remat::detail {

std::string describe_parse_error(const nlohmann::json::exception& error) {
  std::string text = error.what();
  // "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error while parsing value - ..."
  const size_t id_end = text.find("] ");
  if (text.rfind("[json.exception.", 0) == 0 && id_end != std::string::npos) text = text.substr(id_end + 2);
  for (const char* noise : {"parse error ", "syntax error while parsing value - "}) {
    const size_t at = text.find(noise);
    if (at != std::string::npos) text.erase(at, std::strlen(noise));
  }
  return text.size() > 200 ? text.substr(0, 200) + "..." : text;
}

nlohmann::json parse_json_document(const std::string& text, const std::string& source, int64_t max_depth,
                                   const std::string& expected) {
  // Before parsing: the value's copies and dump() would recurse once per level (brackets nest
  // one deeper than values: a scalar in an array at depth 1 sits inside one bracket).
  check_json_nesting(text, source, max_depth + 1, expected);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    REMAT_CHECK(false, source, ": not valid JSON (", describe_parse_error(e), "). Expected ", expected, ".");
  }
  REMAT_CHECK(!json_deeper_than(j, max_depth), source, ": the JSON nests deeper than ", max_depth,
              " levels, more than any such file can. Expected ", expected, ".");
  REMAT_CHECK(j.is_object(), source, ": expected ", expected, " (a JSON object), found ", describe_json(j), ".");
  return j;
}

bool json_deeper_than(const nlohmann::json& root, int64_t limit) {
  std::vector<std::pair<const nlohmann::json*, int64_t>> stack{{&root, 0}};
  while (!stack.empty()) {
    const auto [value, depth] = stack.back();
    stack.pop_back();
    if (depth > limit) return true;
    if (value->is_structured()) {
      for (const auto& child : *value) stack.emplace_back(&child, depth + 1);
    }
  }
  return false;
}

std::string shortened(const std::string& text, size_t most) {
  return text.size() > most ? text.substr(0, most - 3) + "..." : text;
}

std::string describe_json(const nlohmann::json& value) {
  if (value.is_array()) return "an array of " + std::to_string(value.size()) + " elements";
  if (value.is_object()) {
    std::string keys;
    for (const auto& [key, _] : value.items()) {
      if (keys.size() > 80) {
        keys += ", ...";
        break;
      }
      keys += (keys.empty() ? "" : ", ") + ("\"" + key + "\"");
    }
    return "an object with keys " + (keys.empty() ? std::string("(none)") : keys);
  }
  return shortened(value.dump());
}

JsonFields::JsonFields(const nlohmann::json& value, std::string where) : object_(value), where_(std::move(where)) {
  REMAT_CHECK(value.is_object(), where_, " must be a JSON object, found ", describe_json(value), ".");
}

const nlohmann::json& JsonFields::field(const char* key) const {
  const auto it = object_.find(key);
  REMAT_CHECK(it != object_.end(), where_, ": field '", key, "' is missing.");
  return *it;
}

const nlohmann::json& JsonFields::array(const char* key) const {
  const nlohmann::json& value = field(key);
  REMAT_CHECK(value.is_array(), where_, ": field '", key, "' must be an array, found ", describe_json(value), ".");
  return value;
}

std::string JsonFields::string(const char* key) const {
  const nlohmann::json& value = field(key);
  REMAT_CHECK(value.is_string(), where_, ": field '", key, "' must be a string, found ", describe_json(value), ".");
  return value.get<std::string>();
}

std::string JsonFields::string_or(const char* key, const std::string& fallback) const {
  return has(key) ? string(key) : fallback;
}

int64_t JsonFields::integer_or(const char* key, int64_t fallback) const {
  if (!has(key)) return fallback;
  const nlohmann::json& value = field(key);
  REMAT_CHECK(value.is_number_integer(), where_, ": field '", key, "' must be an integer, found ", describe_json(value),
              ".");
  REMAT_CHECK(value.is_number_unsigned() ? value.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX) : true, where_,
              ": field '", key, "' is out of range, found ", describe_json(value), ".");
  return value.get<int64_t>();
}

int64_t JsonFields::bytes(const char* key) const {
  const nlohmann::json& value = field(key);
  const bool integer = value.is_number_integer();
  // Integers beyond int64 are refused here, where they are still JSON; the range is checked on the
  // table (CostTable::check_well_formed), in the same words.
  const bool in_range =
      integer && (!value.is_number_unsigned() || value.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX));
  REMAT_CHECK(in_range, where_, ": field '", key, "' must be ", kBytesExpected, ", found ", describe_json(value),
              integer || !value.is_number() ? "." : " (not an integer).");
  return value.get<int64_t>();
}

int64_t JsonFields::bytes_or(const char* key, int64_t fallback) const { return has(key) ? bytes(key) : fallback; }

double JsonFields::seconds(const char* key) const {
  const nlohmann::json& value = field(key);
  REMAT_CHECK(value.is_number(), where_, ": field '", key, "' must be ", kSecondsExpected, ", found ",
              describe_json(value), ".");
  return value.get<double>();
}

}  // namespace remat::detail
