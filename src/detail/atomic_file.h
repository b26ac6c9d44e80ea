// Writing a file so that readers see either the old file or the whole new one: the text goes to a
// temporary beside the target (a name of its own per process and call), is flushed to disk, and
// only then renamed over the target. A failed write removes the temporary and leaves the target.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "remat/error.h"

namespace remat::detail {

inline void write_file_atomically(const std::string& path, const std::string& text) {
  static std::atomic<unsigned> counter{0};
  const std::string temporary = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  std::FILE* file = std::fopen(temporary.c_str(), "wb");
  REMAT_CHECK(file != nullptr, "cannot write '", temporary, "' (", std::strerror(errno),
              "): check that its folder exists and is writable.");
  bool ok = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  ok = std::fflush(file) == 0 && ok;
  ok = ::fsync(::fileno(file)) == 0 && ok;
  const int saved_errno = errno;
  ok = std::fclose(file) == 0 && ok;
  if (!ok) {
    std::remove(temporary.c_str());
    REMAT_CHECK(false, "cannot write '", path, "' (", std::strerror(saved_errno), "; disk full?); it was left as it was.");
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int rename_errno = errno;
    std::remove(temporary.c_str());
    REMAT_CHECK(false, "cannot replace '", path, "' (", std::strerror(rename_errno), ").");
  }
}

}  // namespace remat::detail
