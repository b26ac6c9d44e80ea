// base/json_nesting.h — how deeply a JSON text nests, counted on its bytes before any parser sees
// it. nlohmann-json parses without recursion, but copying, comparing and dump() of the value it
// returns recurse: a document nested 100,000 deep (a few hundred kB of brackets) would overflow
// the stack there. Every reader of user-given JSON (plans, profiles, a saved state's meta.json,
// worker requests) refuses such a text first, with this check. Private to remat and its programs.
//
//   remat::check_json_nesting(text, "plan.json", 515, "a plan written by Plan::to_json");
#pragma once

#include <cstdint>
#include <string>

#include "remat/base/error.h"

namespace remat {

/// The deepest nesting of arrays and objects in `text` (`[]` is 1, `{"a": [1]}` is 2), counting
/// brackets outside strings, in one pass without recursion; stops counting once it exceeds
/// `stop_above`. Malformed text is not refused here (the parser does that with a better message).
inline int64_t json_nesting_depth(const std::string& text, int64_t stop_above) {
  int64_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, a quote included
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > stop_above) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

/// Refuses a JSON text whose arrays and objects nest more than `max_depth` deep: an error naming
/// `source`, the limit and what the file should be (`expected`), before it is parsed.
inline void check_json_nesting(const std::string& text, const std::string& source, int64_t max_depth,
                               const std::string& expected) {
  REMAT_CHECK(json_nesting_depth(text, max_depth) <= max_depth, source,
              ": the JSON nests arrays and objects more than ", max_depth,
              " levels deep, deeper than any such file can; it was not written by remat, or is corrupt. ", "Expected ",
              expected, ".");
}

}  // namespace remat
