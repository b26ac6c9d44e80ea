#include "remat/train/state_dir.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <vector>
#include <fstream>
#include <iomanip>
#include <sstream>

#include <cerrno>
#include <csignal>
#include <cstdlib>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "base/json_nesting.h"
#include "remat/base/error.h"
#include "remat/internal/files.h"

namespace remat::train {

namespace fs = std::filesystem;

namespace {

// One plain name inside the state folder: no separator, no '.' or '..', nothing unprintable.
bool plain_component(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.size() > 255) return false;
  return std::none_of(name.begin(), name.end(),
                      [](char c) { return c == '/' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}

// FNV-1a, 64 bits: a checksum that catches flipped bits and truncation (not tampering).
struct Fnv1a64 {
  uint64_t hash = 1469598103934665603ULL;
  void add(const char* data, size_t size) {
    for (size_t i = 0; i < size; ++i) {
      hash ^= static_cast<unsigned char>(data[i]);
      hash *= 1099511628211ULL;
    }
  }
  std::string hex() const {
    std::ostringstream os;
    os << std::hex << std::setw(16) << std::setfill('0') << hash;
    return os.str();
  }
};

// Size and checksum of a file of a state, read through one descriptor opened without blocking (a
// FIFO planted there would wait for a writer forever) and checked to be a regular file on the
// descriptor itself. A missing file is said to be missing.
struct FileDigest {
  uint64_t bytes = 0;
  std::string fnv1a64;
};

FileDigest digest_of_state_file(const fs::path& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    const int saved = errno;
    REMAT_CHECK(saved != ENOENT, what, " '", path.string(), "' is missing.");
    REMAT_CHECK(saved != ELOOP, what, " '", path.string(),
                "' is a symbolic link; a saved state holds regular files only.");
    REMAT_CHECK(false, what, " '", path.string(), "' cannot be read (", std::strerror(saved), ").");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    REMAT_CHECK(false, what, " '", path.string(), "' is not a regular file (", file_kind(st.st_mode),
                "); a saved state holds regular files only.");
  }
  FileDigest digest;
  digest.bytes = static_cast<uint64_t>(st.st_size);
  Fnv1a64 fnv;
  std::vector<char> buffer(1 << 16);
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int saved = errno;
      ::close(fd);
      REMAT_CHECK(false, what, " '", path.string(), "' cannot be read (", std::strerror(saved), ").");
    }
    if (n == 0) break;
    fnv.add(buffer.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  digest.fnv1a64 = fnv.hex();
  return digest;
}

// meta.json nests 3 levels (the files, each an object); anything far deeper was not written by a save.
constexpr int64_t kMetaNesting = 3;
constexpr int64_t kMetaMaxNesting = 16;

// meta.json's own checksum, over its compact form without the checksum field.
constexpr const char* kMetaChecksum = "meta_fnv1a64";
std::string meta_checksum(nlohmann::json meta) {
  meta.erase(kMetaChecksum);
  const std::string text = meta.dump();
  Fnv1a64 fnv;
  fnv.add(text.data(), text.size());
  return fnv.hex();
}

}  // namespace

std::string fnv1a64_of(const std::string& bytes) {
  Fnv1a64 fnv;
  fnv.add(bytes.data(), bytes.size());
  return fnv.hex();
}

namespace {

std::string step_name(int64_t step) {
  std::ostringstream os;
  os << "step-" << std::setw(6) << std::setfill('0') << step;
  return os.str();
}

// The test hook: the file operation of a save at which to die (0: none).
int crash_before_operation = 0;
int operations_done = 0;

// Called before each file operation of a save, so a test can kill the process between any two.
void file_operation() {
  if (crash_before_operation > 0 && ++operations_done == crash_before_operation) ::kill(::getpid(), SIGKILL);
}

// The names remat writes in a state folder, recognised exactly: whatever else a user keeps there
// (step-0000-notes/, step-000001-backup/, .tmp-mine/) is never taken for remat's and never removed.

// A run of decimal digits at text[at...] up to `end` (npos: the end), without a leading zero unless
// `leading_zeros`, as a number; nullopt for anything else (empty, a sign, too long).
std::optional<int64_t> digits_at(const std::string& text, size_t at, size_t end, bool leading_zeros) {
  if (end == std::string::npos) end = text.size();
  if (at >= end || end - at > 18) return std::nullopt;
  if (!leading_zeros && text[at] == '0' && end - at > 1) return std::nullopt;
  int64_t value = 0;
  for (size_t i = at; i < end; ++i) {
    if (text[i] < '0' || text[i] > '9') return std::nullopt;
    value = value * 10 + (text[i] - '0');
  }
  return value;
}

// A state folder's name exactly as a save writes it (step_name(step), then ".K" for the K-th re-save
// of that step): its step and K (0 for none); nullopt for any other name.
std::optional<std::pair<int64_t, int64_t>> state_name_parts(const std::string& name) {
  if (name.rfind("step-", 0) != 0) return std::nullopt;
  const size_t dot = name.find('.', 5);
  const std::optional<int64_t> step = digits_at(name, 5, dot, /*leading_zeros=*/true);
  if (!step || step_name(*step) != name.substr(0, dot)) return std::nullopt;  // exactly six digits (more, unpadded)
  if (dot == std::string::npos) return std::make_pair(*step, int64_t{0});
  const std::optional<int64_t> resave = digits_at(name, dot + 1, std::string::npos, /*leading_zeros=*/false);
  if (!resave || *resave < 1) return std::nullopt;
  return std::make_pair(*step, *resave);
}

// The process id in a temporary's name, if the name is exactly one a save writes:
// ".tmp-step-000040-PID" (a state being written), ".tmp-probe-PID" (check_state_dir_writable) or
// "latest.tmp.PID.N" (write_file_atomically's, replacing `latest`).
std::optional<int64_t> temporary_pid(const std::string& name) {
  if (name.rfind(".tmp-probe-", 0) == 0) return digits_at(name, 11, std::string::npos, false);
  if (name.rfind("latest.tmp.", 0) == 0) {
    const size_t dot = name.find('.', 11);
    if (dot == std::string::npos || !digits_at(name, dot + 1, std::string::npos, false)) return std::nullopt;
    return digits_at(name, 11, dot, false);
  }
  if (name.rfind(".tmp-step-", 0) != 0) return std::nullopt;
  const size_t dash = name.rfind('-');
  const auto parts = state_name_parts(name.substr(5, dash - 5));
  if (dash <= 5 || !parts || parts->second != 0) return std::nullopt;
  return digits_at(name, dash + 1, std::string::npos, false);
}

// Temporaries of saves that died (kill -9, power loss): a name a save writes, whose process is gone.
bool left_by_a_dead_save(const std::string& name) {
  const std::optional<int64_t> pid = temporary_pid(name);
  if (!pid || *pid <= 0 || *pid == ::getpid()) return false;
  return ::kill(static_cast<pid_t>(*pid), 0) != 0 && errno == ESRCH;
}

// A save ends by writing the new state's name to `latest`: a folder there (not a link to one, which
// is replaced as a name) would fail it after the whole run, so a run checks before its first step.
void refuse_a_folder_at_latest(const fs::path& dir) {
  std::error_code error;
  REMAT_CHECK(!fs::is_directory(fs::symlink_status(dir / "latest", error)), "cannot save state in '", dir.string(),
              "': its 'latest' is a folder, but a save writes the name of the newest state there, as a file. ",
              "Move that folder away, or choose another folder to save to.");
}

// A complete state a save wrote: a folder (not a link) of a state's exact name holding a meta.json.
bool saved_state(const fs::directory_entry& entry) {
  std::error_code error;
  return state_name_parts(entry.path().filename().string()) &&
         fs::is_directory(fs::symlink_status(entry.path(), error)) &&
         fs::is_regular_file(fs::symlink_status(entry.path() / "meta.json", error));
}

// A name no state in `dir` has: step-000040, or step-000040.1, .2, ... for a re-save of that step
// (sorting after it and before step-000041), so a re-save never moves the state `latest` names.
std::string unused_state_name(const fs::path& dir, int64_t step) {
  std::error_code error;
  std::string name = step_name(step);
  for (int k = 1; fs::exists(dir / name, error); ++k) name = step_name(step) + "." + std::to_string(k);
  return name;
}

}  // namespace

void crash_state_save_before_operation_for_testing(int operation) {
  crash_before_operation = operation;
  operations_done = 0;
}

void check_state_dir_writable(const fs::path& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  REMAT_CHECK(!error && fs::is_directory(dir), "cannot create the state directory '", dir.string(), "' (",
              error ? error.message() : std::string("a file of that name is in the way"),
              "); choose a folder you can write.");
  refuse_a_folder_at_latest(dir);
  const fs::path probe = dir / (".tmp-probe-" + std::to_string(::getpid()));
  const bool written = static_cast<bool>(std::ofstream(probe) << "probe\n");
  fs::remove(probe, error);
  REMAT_CHECK(written, "cannot write in the state directory '", dir.string(), "'; choose a folder you can write.");
}

fs::path save_state_dir(const fs::path& dir, int64_t step, nlohmann::json meta,
                        const std::function<void(const fs::path&)>& write_files, int keep_last) {
  REMAT_CHECK(keep_last >= 1, "save_state_dir: keep_last must be at least 1 (the state just saved), got ", keep_last,
              ".");
  std::error_code error;
  fs::create_directories(dir, error);
  REMAT_CHECK(!error && fs::is_directory(dir), "cannot create the state directory '", dir.string(),
              "': ", error.message(), ".");
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    if (left_by_a_dead_save(entry.path().filename().string())) fs::remove_all(entry.path(), error);
  }
  refuse_a_folder_at_latest(dir);
  const fs::path temporary = dir / (".tmp-" + step_name(step) + "-" + std::to_string(::getpid()));
  fs::remove_all(temporary, error);
  file_operation();
  fs::create_directory(temporary, error);
  REMAT_CHECK(!error && fs::is_directory(fs::symlink_status(temporary, error)),
              "cannot create a folder in the state directory '", dir.string(), "' (",
              error ? error.message() : std::string("something is in the way"), ").");
  try {
    file_operation();
    write_files(temporary);
    nlohmann::json files = nlohmann::json::object();
    fs::directory_iterator listing(temporary, error);
    REMAT_CHECK(!error, "cannot list the state being saved in '", temporary.string(), "' (", error.message(), ").");
    for (const auto& entry : listing) {
      file_operation();
      sync_to_disk(entry.path());
      const FileDigest digest = digest_of_state_file(entry.path(), "the state file just written");
      files[entry.path().filename().string()] = {{"bytes", digest.bytes}, {"fnv1a64", digest.fnv1a64}};
    }
    meta["files"] = files;
    meta[kMetaChecksum] = meta_checksum(meta);
    file_operation();
    write_file_atomically((temporary / "meta.json").string(), meta.dump(2));
    file_operation();
    sync_to_disk(temporary);
  } catch (...) {
    fs::remove_all(temporary, error);
    throw;
  }
  // Into place under a name of its own, then `latest` names it: at every instant `latest` names a
  // complete state (the old one until the rename of `latest`, the new one after).
  const std::string name = unused_state_name(dir, step);
  file_operation();
  fs::rename(temporary, dir / name, error);
  REMAT_CHECK(!error, "cannot move the saved state into place in '", dir.string(), "' (", error.message(),
              "); the previous state is untouched.");
  file_operation();
  sync_to_disk(dir);
  file_operation();
  // As a name: a link planted at `latest` is replaced, never written through.
  write_file_atomically((dir / "latest").string(), name + "\n", AtPath::replace_name);
  file_operation();
  sync_to_disk(dir);
  // Only now are older states garbage: all but the newest `keep_last` up to this one (an earlier
  // save of this step included). States of later steps (a run this one resumed before) stay, and
  // so does everything whose name is not exactly a state's (a user's step-000001-backup/).
  const auto saved = *state_name_parts(name);
  std::vector<std::pair<std::pair<int64_t, int64_t>, std::string>> older;  // by step, then re-save
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string other = entry.path().filename().string();
    const auto parts = state_name_parts(other);
    if (parts && *parts < saved && saved_state(entry)) older.emplace_back(*parts, other);
  }
  std::sort(older.begin(), older.end());
  const size_t keep_older = static_cast<size_t>(keep_last - 1);
  for (size_t i = 0; i + keep_older < older.size(); ++i) {
    file_operation();
    fs::remove_all(dir / older[i].second, error);
  }
  return dir / name;
}

std::pair<fs::path, nlohmann::json> load_state_dir(const fs::path& dir) {
  const std::string where = c10::str(field("TrainOptions::resume_dir"));
  std::error_code error;
  REMAT_CHECK(fs::is_directory(dir, error), where, ": '", dir.string(),
              "' is not a directory of saved state; pass the ", "directory a state was saved to.");
  const fs::path latest = dir / "latest";
  REMAT_CHECK(fs::exists(fs::symlink_status(latest, error)), where, ": '", dir.string(),
              "' holds no saved state (no 'latest' file).");
  // `latest` holds one name and a newline: a few hundred bytes at most, whatever is planted there.
  std::string name = read_regular_file(latest.string(), where + ": the state's 'latest' file", 4096);
  if (!name.empty() && name.back() == '\n') name.pop_back();
  REMAT_CHECK(plain_component(name), where, ": '", latest.string(),
              "' should name one state folder (like step-000040) but holds ", printable(name, 60),
              "; the state is corrupt. Resume from another copy.");
  const fs::path state = dir / name;
  REMAT_CHECK(fs::is_directory(fs::symlink_status(state, error)), where, ": '", latest.string(), "' names '", name,
              "', which is not a state folder in '", dir.string(), "'; the state is corrupt.");
  nlohmann::json meta;
  const std::string meta_path = (state / "meta.json").string();
  {
    REMAT_CHECK(fs::exists(fs::symlink_status(meta_path, error)), where, ": '", meta_path,
                "' is missing; the state is corrupt.");
    // A state's meta.json lists a handful of files: 16 MiB is far beyond any real one.
    const std::string text = read_regular_file(meta_path, where + ": the state's meta.json", int64_t{16} << 20);
    // The JSON parser stops at a NUL and would accept what precedes it: a padded file is corrupt.
    const size_t nul = text.find('\0');
    REMAT_CHECK(nul == std::string::npos, where, ": '", meta_path, "' holds a NUL byte at byte ", nul,
                ": it is not the text remat wrote; the state is corrupt.");
    // Before parsing: copying or dumping a value nested 100,000 deep would overflow the stack.
    check_json_nesting(text, where + ": '" + meta_path + "'", kMetaMaxNesting,
                       "the meta.json remat wrote (it nests " + std::to_string(kMetaNesting) +
                           " levels); the state is corrupt. Resume from another copy");
    try {
      meta = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      REMAT_CHECK(false, where, ": '", meta_path, "' is not valid JSON (it stops making sense at byte ", e.byte,
                  "); the state is corrupt.");
    }
  }
  REMAT_CHECK(meta.is_object() && meta.contains("files") && meta["files"].is_object(), where, ": '", meta_path,
              "' lists no files; the state is corrupt.");
  // Required: were a state without one accepted, deleting the key would turn the check off.
  REMAT_CHECK(meta.contains(kMetaChecksum), where, ": '", meta_path, "' has no checksum (", kMetaChecksum,
              "): it was edited, or written by a remat older than the checksum. Resume from another copy.");
  REMAT_CHECK(meta[kMetaChecksum].is_string() && meta[kMetaChecksum].get<std::string>() == meta_checksum(meta), where,
              ": '", meta_path, "' does not match its checksum (", printable(meta[kMetaChecksum].dump(), 40),
              "): it was changed or is corrupt. Resume from another copy.");
  for (const auto& [file, info] : meta["files"].items()) {
    REMAT_CHECK(plain_component(file) && info.is_object() && info.contains("bytes") &&
                    info["bytes"].is_number_unsigned() && info.contains("fnv1a64") && info["fnv1a64"].is_string(),
                where, ": '", meta_path, "' lists ", printable(file, 60),
                " without a plain name, its size and its checksum; the state is corrupt.");
    const fs::path path = state / file;
    const FileDigest digest = digest_of_state_file(path, where + ": state file");
    const auto expected_bytes = info["bytes"].get<uint64_t>();
    REMAT_CHECK(digest.bytes == expected_bytes, where, ": state file '", path.string(), "' has ", digest.bytes,
                " bytes but ", expected_bytes,
                " were written: it is truncated or was changed. Resume from another copy.");
    REMAT_CHECK(digest.fnv1a64 == info["fnv1a64"].get<std::string>(), where, ": state file '", path.string(),
                "' does not match its checksum: it is corrupt. Resume from another copy.");
  }
  return {state, meta};
}

}  // namespace remat::train
