#include "remat/train/state_dir.h"

#include <algorithm>
#include <cstdio>
#include <vector>
#include <fstream>
#include <iomanip>
#include <sstream>

#include <cerrno>
#include <csignal>
#include <cstdlib>

#include <unistd.h>

#include "remat/error.h"
#include "remat/internal/files.h"

namespace remat::train {

namespace fs = std::filesystem;

namespace {

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

std::string fnv1a64(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REMAT_CHECK(in.good(), "cannot read '", path.string(), "'.");
  Fnv1a64 fnv;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) fnv.add(buffer, static_cast<size_t>(in.gcount()));
  return fnv.hex();
}

// meta.json's own checksum, over its compact form without the checksum field.
constexpr const char* kMetaChecksum = "meta_fnv1a64";
std::string meta_checksum(nlohmann::json meta) {
  meta.erase(kMetaChecksum);
  const std::string text = meta.dump();
  Fnv1a64 fnv;
  fnv.add(text.data(), text.size());
  return fnv.hex();
}

// At most `limit` characters of `text`, for error messages about files that may be large.
std::string excerpt(const std::string& text, size_t limit = 120) {
  return text.size() <= limit ? text : text.substr(0, limit) + "...";
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

// Temporaries of saves that died (kill -9, power loss): their process is gone.
bool left_by_a_dead_save(const std::string& name) {
  if (name.rfind(".tmp-", 0) != 0 && name.rfind(".old-", 0) != 0) return false;
  const size_t dash = name.rfind('-');
  const long pid = std::strtol(name.c_str() + dash + 1, nullptr, 10);
  if (pid <= 0) return true;  // not a name a save writes
  if (pid == ::getpid()) return false;
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
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
  const fs::path probe = dir / (".tmp-probe-" + std::to_string(::getpid()));
  const bool written = static_cast<bool>(std::ofstream(probe) << "probe\n");
  fs::remove(probe, error);
  REMAT_CHECK(written, "cannot write in the state directory '", dir.string(), "'; choose a folder you can write.");
}

fs::path save_state_dir(const fs::path& dir, int64_t step, nlohmann::json meta,
                        const std::function<void(const fs::path&)>& write_files, int keep_last) {
  REMAT_CHECK(keep_last >= 1, "save_state_dir: keep_last must be at least 1 (the state just saved), got ", keep_last, ".");
  std::error_code error;
  fs::create_directories(dir, error);
  REMAT_CHECK(!error && fs::is_directory(dir), "cannot create the state directory '", dir.string(), "': ",
              error.message(), ".");
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    if (left_by_a_dead_save(entry.path().filename().string())) fs::remove_all(entry.path(), error);
  }
  const fs::path temporary = dir / (".tmp-" + step_name(step) + "-" + std::to_string(::getpid()));
  fs::remove_all(temporary, error);
  file_operation();
  fs::create_directory(temporary);
  try {
    file_operation();
    write_files(temporary);
    nlohmann::json files = nlohmann::json::object();
    for (const auto& entry : fs::directory_iterator(temporary)) {
      file_operation();
      sync_to_disk(entry.path());
      files[entry.path().filename().string()] = {{"bytes", fs::file_size(entry.path())}, {"fnv1a64", fnv1a64(entry.path())}};
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
  fs::rename(temporary, dir / name);
  file_operation();
  sync_to_disk(dir);
  file_operation();
  write_file_atomically((dir / "latest").string(), name + "\n");
  file_operation();
  sync_to_disk(dir);
  // Only now are older states garbage: all but the newest `keep_last` up to this one (an earlier
  // save of this step included). States of later steps (a run this one resumed before) stay.
  std::vector<std::string> older;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string other = entry.path().filename().string();
    if (other.rfind("step-", 0) == 0 && other < name) older.push_back(other);  // zero-padded: names sort by step
  }
  std::sort(older.begin(), older.end());
  const size_t keep_older = static_cast<size_t>(keep_last - 1);
  for (size_t i = 0; i + keep_older < older.size(); ++i) {
    file_operation();
    fs::remove_all(dir / older[i], error);
  }
  return dir / name;
}

std::pair<fs::path, nlohmann::json> load_state_dir(const fs::path& dir) {
  std::error_code error;
  REMAT_CHECK(fs::is_directory(dir, error), field("TrainOptions::resume_dir"), ": '", dir.string(), "' is not a directory of saved state; pass the ",
              "directory a state was saved to.");
  const fs::path latest = dir / "latest";
  REMAT_CHECK(fs::exists(latest, error), field("TrainOptions::resume_dir"), ": '", dir.string(), "' holds no saved state (no 'latest' file).");
  std::string name;
  {
    std::ifstream in(latest);
    std::getline(in, name);
  }
  const fs::path state = dir / name;
  REMAT_CHECK(!name.empty() && name.find('/') == std::string::npos && fs::is_directory(state, error), field("TrainOptions::resume_dir"), ": '",
              latest.string(), "' names '", name, "', which is not a state directory; the state is corrupt.");
  nlohmann::json meta;
  const std::string meta_path = (state / "meta.json").string();
  try {
    std::ifstream in(meta_path);
    meta = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    REMAT_CHECK(false, field("TrainOptions::resume_dir"), ": '", meta_path, "' is not valid JSON (", excerpt(e.what()), "); the state is corrupt.");
  }
  REMAT_CHECK(meta.is_object() && meta.contains("files") && meta["files"].is_object(), field("TrainOptions::resume_dir"), ": '", meta_path,
              "' lists no files; the state is corrupt.");
  // Required: were a state without one accepted, deleting the key would turn the check off.
  REMAT_CHECK(meta.contains(kMetaChecksum), field("TrainOptions::resume_dir"), ": '", meta_path, "' has no checksum (", kMetaChecksum,
              "): it was edited, or written by a remat older than the checksum. Resume from another copy.");
  REMAT_CHECK(meta[kMetaChecksum].is_string() && meta[kMetaChecksum].get<std::string>() == meta_checksum(meta),
              field("TrainOptions::resume_dir"), ": '", meta_path, "' does not match its checksum (", excerpt(meta[kMetaChecksum].dump(), 40),
              "): it was changed or is corrupt. Resume from another copy.");
  for (const auto& [file, info] : meta["files"].items()) {
    const fs::path path = state / file;
    REMAT_CHECK(fs::exists(path, error), field("TrainOptions::resume_dir"), ": state file '", path.string(), "' is missing.");
    const auto expected_bytes = info.value("bytes", static_cast<uint64_t>(0));
    const auto bytes = fs::file_size(path);
    REMAT_CHECK(bytes == expected_bytes, field("TrainOptions::resume_dir"), ": state file '", path.string(), "' has ", bytes, " bytes but ",
                expected_bytes, " were written: it is truncated or was changed. Resume from another copy.");
    REMAT_CHECK(fnv1a64(path) == info.value("fnv1a64", std::string()), field("TrainOptions::resume_dir"), ": state file '", path.string(),
                "' does not match its checksum: it is corrupt. Resume from another copy.");
  }
  return {state, meta};
}

}  // namespace remat::train
