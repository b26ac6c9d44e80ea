#include "remat/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "remat/error.h"

namespace remat {

void write_file_atomically(const std::string& path, const std::string& text) {
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

void sync_to_disk(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace remat
