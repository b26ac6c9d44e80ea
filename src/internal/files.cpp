#include "remat/internal/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "remat/base/error.h"

namespace remat {
namespace {

// The regular file the bytes replace: `path`, or what a symbolic link at `path` finally names
// (the link is kept: renaming over the link itself would turn it into a file). Anything else —
// a device node, a FIFO, a socket, a folder — is refused: renaming a temporary over it would
// replace it with a regular file, and /dev/stdout is such a link (to a pipe or a terminal).
std::string regular_target(const std::string& path, struct stat& st, bool& exists) {
  exists = false;
  if (::lstat(path.c_str(), &st) != 0) {
    REMAT_CHECK(errno == ENOENT, "cannot write '", path, "' (", std::strerror(errno), ").");
    return path;
  }
  std::string target = path;
  const bool link = S_ISLNK(st.st_mode);
  if (link) {
    REMAT_CHECK(::stat(path.c_str(), &st) == 0, "cannot write '", path, "': it is a symbolic link to a missing file ",
                "or a loop (", std::strerror(errno), "); point it at a regular file or remove it.");
  }
  REMAT_CHECK(S_ISREG(st.st_mode), "cannot write '", path, "': it is ", file_kind(st.st_mode),
              link ? " (through a symbolic link)" : "",
              "; remat writes regular files only, through a temporary renamed over the old file. Give the name of a ",
              "regular file.");
  if (link) {
    char* resolved = ::realpath(path.c_str(), nullptr);
    REMAT_CHECK(resolved != nullptr, "cannot write '", path, "' (", std::strerror(errno), ").");
    target = resolved;
    std::free(resolved);
  }
  exists = true;
  return target;
}

std::string folder_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& text, AtPath at_path) {
  static std::atomic<unsigned> counter{0};
  REMAT_CHECK(!path.empty(), "cannot write a file with an empty name.");
  struct stat old {};
  bool exists = false;
  std::string target = path;
  if (at_path == AtPath::follow_link) {
    target = regular_target(path, old, exists);
  } else if (::lstat(path.c_str(), &old) == 0) {
    REMAT_CHECK(!S_ISDIR(old.st_mode), "cannot write '", path, "': a folder is in the way; remove it.");
    exists = S_ISREG(old.st_mode);
  }
  const std::string temporary = target + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  // O_EXCL: never through something already at the temporary's name (a planted link).
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  REMAT_CHECK(fd >= 0, "cannot write '", temporary, "' (", std::strerror(errno),
              "): check that its folder exists and is writable.");
  // A replaced file keeps its permissions (a private plan stays private).
  if (exists) (void)::fchmod(fd, old.st_mode & 07777);
  std::FILE* file = ::fdopen(fd, "wb");
  if (file == nullptr) {
    const int saved = errno;
    ::close(fd);
    std::remove(temporary.c_str());
    REMAT_CHECK(false, "cannot write '", path, "' (", std::strerror(saved), ").");
  }
  bool ok = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  ok = std::fflush(file) == 0 && ok;
  ok = ::fsync(::fileno(file)) == 0 && ok;
  const int saved_errno = errno;
  ok = std::fclose(file) == 0 && ok;
  if (!ok) {
    std::remove(temporary.c_str());
    REMAT_CHECK(false, "cannot write '", path, "' (", std::strerror(saved_errno),
                "; disk full?); it was left as it was.");
  }
  if (std::rename(temporary.c_str(), target.c_str()) != 0) {
    const int rename_errno = errno;
    std::remove(temporary.c_str());
    REMAT_CHECK(false, "cannot replace '", path, "' (", std::strerror(rename_errno), ").");
  }
  // The rename is durable once the folder's entries are.
  sync_to_disk(folder_of(target));
}

std::string read_regular_file(const std::string& path, const std::string& what, int64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO without a writer must not wait; the type is then read off the
  // opened file itself, so it cannot change between the check and the read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  REMAT_CHECK(fd >= 0 || errno != ENOENT, what, " '", path, "' does not exist.");
  REMAT_CHECK(fd >= 0, what, " '", path, "' cannot be read (", std::strerror(errno), ").");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > max_bytes) {
    const bool regular = S_ISREG(st.st_mode);
    ::close(fd);
    REMAT_CHECK(regular, what, " '", path, "' is ", file_kind(st.st_mode), "; give the name of a regular file.");
    REMAT_CHECK(false, what, " '", path, "' holds ", st.st_size, " bytes, more than the ", max_bytes,
                " this file can sensibly be; is it the right file?");
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // shrunk while being read: what was there
    done += static_cast<size_t>(n);
  }
  const int read_errno = errno;
  ::close(fd);
  REMAT_CHECK(done == text.size() || read_errno == 0, what, " '", path, "' cannot be read (", std::strerror(read_errno),
              ").");
  text.resize(done);
  return text;
}

const char* file_kind(unsigned mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

void sync_to_disk(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace remat
