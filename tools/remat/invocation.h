// The command line this process was started with, for reports that say how to reproduce them.
#pragma once

#include <string>
#include <vector>

namespace remat::cli {

inline std::string& invocation() {
  static std::string text;
  return text;
}

/// The arguments themselves, argv[1..].
inline std::vector<std::string>& invocation_arguments() {
  static std::vector<std::string> arguments;
  return arguments;
}

/// Records argv as one shell-readable line (arguments with spaces or shell characters quoted).
inline void record_invocation(int argc, char** argv) {
  std::string& text = invocation();
  text.clear();
  invocation_arguments().assign(argv + (argc > 0 ? 1 : 0), argv + argc);
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
