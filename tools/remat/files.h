// Files the CLI writes: atomically (see src/detail/atomic_file.h), so a crash or a full disk
// leaves the previous file whole rather than half a new one.
#pragma once

#include "detail/atomic_file.h"

namespace remat::cli {

using detail::write_file_atomically;

/// A CSV field: quoted, with inner quotes doubled, when it holds a comma, a quote or a newline.
inline std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace remat::cli
