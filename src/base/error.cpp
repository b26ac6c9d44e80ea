#include "remat/base/error.h"

#include <algorithm>

namespace remat {
namespace {

constexpr char kMarker = '\x1f';  // ASCII unit separator: around a field's name in a marked message

std::string render(const std::string& marked, const std::function<std::string(const std::string&)>& name_of) {
  std::string out;
  size_t at = 0;
  while (true) {
    const size_t open = marked.find(kMarker, at);
    const size_t close = open == std::string::npos ? std::string::npos : marked.find(kMarker, open + 1);
    if (close == std::string::npos) return out + marked.substr(at);
    out += marked.substr(at, open - at) + name_of(marked.substr(open + 1, close - open - 1));
    at = close + 1;
  }
}

std::string as_named(const std::string& field) { return field; }

}  // namespace

std::ostream& operator<<(std::ostream& out, const Field& field) {
  return out << kMarker << (field.name == nullptr ? "" : field.name) << kMarker;
}

FieldError::FieldError(c10::SourceLocation where, const std::string& marked_message)
    : c10::Error(where, render(marked_message, as_named)), marked_(marked_message) {
  render(marked_, [this](const std::string& field) {
    if (std::find(fields_.begin(), fields_.end(), field) == fields_.end()) fields_.push_back(field);
    return field;
  });
}

std::string FieldError::message_naming(const std::function<std::string(const std::string&)>& name_of) const {
  return render(marked_, name_of);
}

namespace {

// Length of the valid UTF-8 sequence at text[i] and its code point; 0 when the bytes there are not
// one (a stray continuation byte, a truncated sequence, an overlong form, a surrogate, > U+10FFFF).
size_t utf8_at(const std::string& text, size_t i, uint32_t& code_point) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  const size_t length = lead >= 0xC2 && lead <= 0xDF   ? 2
                        : lead >= 0xE0 && lead <= 0xEF ? 3
                        : lead >= 0xF0 && lead <= 0xF4 ? 4
                                                       : 0;
  if (length == 0 || i + length > text.size()) return 0;
  code_point = lead & (0xFF >> (length + 1));
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    code_point = (code_point << 6) | (byte(i + k) & 0x3F);
  }
  const uint32_t least = length == 2 ? 0x80 : length == 3 ? 0x800 : 0x10000;
  if (code_point < least || code_point > 0x10FFFF || (code_point >= 0xD800 && code_point <= 0xDFFF)) return 0;
  return length;
}

}  // namespace

std::string escape_unprintable(const std::string& text) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    uint32_t code_point = 0;
    const size_t length = c >= 0x80 ? utf8_at(text, i, code_point) : 0;
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else if (length > 0 && code_point >= 0xA0) {
      out.append(text, i, length);  // a printable character beyond ASCII, as it is
      i += length;
      continue;
    } else if (length > 0) {
      // A C1 control (U+0080 to U+009F: U+009B is a terminal's CSI, like ESC [).
      out += "\\u00";
      out += hex[code_point >> 4];
      out += hex[code_point & 15];
      i += length;
      continue;
    } else {
      // A control byte, DEL, or a byte that is not part of valid UTF-8.
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
    ++i;
  }
  return out;
}

std::string printable(const std::string& text, size_t max_chars) {
  size_t shown = std::min(text.size(), max_chars);
  while (shown > 0 && shown < text.size() && (static_cast<unsigned char>(text[shown]) & 0xC0) == 0x80)
    --shown;  // whole UTF-8 characters
  std::string out = "'" + escape_unprintable(text.substr(0, shown)) + "'";
  if (shown < text.size()) out += " (and " + std::to_string(text.size() - shown) + " more characters)";
  return out;
}

namespace detail {

void throw_error(const char* function, const char* file, uint32_t line, const std::string& message) {
  const c10::SourceLocation where{function, file, line};
  if (message.find(kMarker) != std::string::npos) throw FieldError(where, message);
  throw c10::Error(where, message);
}

}  // namespace detail
}  // namespace remat
