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

std::string printable(const std::string& text, size_t max_chars) {
  std::string out = "'";
  size_t shown = std::min(text.size(), max_chars);
  while (shown > 0 && shown < text.size() && (static_cast<unsigned char>(text[shown]) & 0xC0) == 0x80)
    --shown;  // whole UTF-8 characters
  for (size_t i = 0; i < shown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  out += "'";
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
