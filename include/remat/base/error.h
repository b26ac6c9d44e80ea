// remat/base/error.h — how remat reports misuse.
//
// Every user error is a `c10::Error` (the exception LibTorch itself throws), with a message that
// starts with "remat: ", says what was expected and, where it helps, how to fix it. Tests match
// substrings of these messages, so treat their wording as part of the interface.
//
// A message about an input a caller set (an options field, an argument) names it with
// `remat::field("Options::depth")`; the error is then a `remat::FieldError`, which lists those
// fields and can be rendered with other names for them: a command-line program that took the value
// from a flag says `--depth` (message_naming), with no rewriting of the text.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

namespace remat {

/// An input named in an error message (see the top of this header).
struct Field {
  const char* name;
};
inline Field field(const char* name) { return Field{name}; }
/// Writes the field's name between markers FieldError reads back (never seen by users).
std::ostream& operator<<(std::ostream& out, const Field& field);

/// A user error whose message names fields: what() names them as the library does.
class FieldError : public c10::Error {
 public:
  FieldError(c10::SourceLocation where, const std::string& marked_message);
  /// The fields named, in order of appearance (repeats kept once).
  const std::vector<std::string>& fields() const { return fields_; }
  /// The message with each field named by `name_of(field)` instead of the field itself.
  std::string message_naming(const std::function<std::string(const std::string& field)>& name_of) const;

 private:
  std::string marked_;
  std::vector<std::string> fields_;
};

/// `text` as an error message may quote it: in single quotes, escaped as escape_unprintable does,
/// at most `max_chars` bytes of it (whole characters) and then how many more there were. For values
/// a user or a file supplied: a 100 kB argument or a terminal escape in a stage name must not reach
/// the terminal as it is.
std::string printable(const std::string& text, size_t max_chars = 100);

/// `text` with nothing a terminal could act on: printable ASCII and valid UTF-8 characters from
/// U+00A0 up as they are; \n, \r and \t as those two characters; other control bytes, DEL and
/// every byte that is not part of valid UTF-8 as \xNN; C1 controls (U+0080 to U+009F, U+009B being
/// a CSI) as \u00NN.
std::string escape_unprintable(const std::string& text);

namespace detail {
/// Throws FieldError when `message` names a field, c10::Error otherwise.
[[noreturn]] void throw_error(const char* function, const char* file, uint32_t line, const std::string& message);
}  // namespace detail

}  // namespace remat

/// Throws a `c10::Error` (a `remat::FieldError` when it names fields) with "remat: " and the
/// streamed message parts when `cond` is false.
#define REMAT_CHECK(cond, ...)                                                          \
  do {                                                                                  \
    if (C10_UNLIKELY(!(cond))) {                                                        \
      ::remat::detail::throw_error(__func__, __FILE__, static_cast<uint32_t>(__LINE__), \
                                   ::c10::str("remat: ", __VA_ARGS__));                 \
    }                                                                                   \
  } while (false)
