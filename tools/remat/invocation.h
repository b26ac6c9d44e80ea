// The command line this process was started with, for reports that say how to reproduce them.
#pragma once

#include <string>

namespace remat::cli {

inline std::string& invocation() {
  static std::string text;
  return text;
}

/// Records argv as one shell-readable line (arguments with spaces or shell characters quoted).
inline void record_invocation(int argc, char** argv) {
  std::string& text = invocation();
  text.clear();
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (i == 0) {
      const auto slash = arg.rfind('/');
      if (slash != std::string::npos) arg = arg.substr(slash + 1);  // "remat", wherever it was built
    }
    const bool plain = !arg.empty() && arg.find_first_of(" \t'\"$;&|<>*?()[]{}\\!#~`") == std::string::npos;
    text += (i ? " " : "") + (plain ? arg : "'" + arg + "'");
  }
}

}  // namespace remat::cli
