#include "remat/train/state_dir.h"

#include <cstdio>
#include <fstream>
#include <iomanip>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

#include "remat/error.h"

namespace remat::train {

namespace fs = std::filesystem;

namespace {

std::string fnv1a64(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REMAT_CHECK(in.good(), "cannot read '", path.string(), "'.");
  uint64_t hash = 1469598103934665603ULL;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    for (std::streamsize i = 0; i < in.gcount(); ++i) {
      hash ^= static_cast<unsigned char>(buffer[i]);
      hash *= 1099511628211ULL;
    }
  }
  std::ostringstream os;
  os << std::hex << std::setw(16) << std::setfill('0') << hash;
  return os.str();
}

void fsync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void write_text_durably(const fs::path& path, const std::string& text) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    REMAT_CHECK(out.good(), "cannot write '", path.string(), "'.");
  }
  fsync_path(path);
}

std::string step_name(int64_t step) {
  std::ostringstream os;
  os << "step-" << std::setw(6) << std::setfill('0') << step;
  return os.str();
}

}  // namespace

fs::path save_state_dir(const fs::path& dir, int64_t step, nlohmann::json meta,
                        const std::function<void(const fs::path&)>& write_files) {
  std::error_code error;
  fs::create_directories(dir, error);
  REMAT_CHECK(!error && fs::is_directory(dir), "cannot create the state directory '", dir.string(), "': ",
              error.message(), ".");
  const fs::path temporary = dir / (".tmp-" + step_name(step) + "-" + std::to_string(::getpid()));
  fs::remove_all(temporary, error);
  fs::create_directory(temporary);
  try {
    write_files(temporary);
    nlohmann::json files = nlohmann::json::object();
    for (const auto& entry : fs::directory_iterator(temporary)) {
      fsync_path(entry.path());
      files[entry.path().filename().string()] = {{"bytes", fs::file_size(entry.path())}, {"fnv1a64", fnv1a64(entry.path())}};
    }
    meta["files"] = files;
    write_text_durably(temporary / "meta.json", meta.dump(2));
    fsync_path(temporary);
  } catch (...) {
    fs::remove_all(temporary, error);
    throw;
  }
  // Into place: a state of the same step (a re-save) is moved aside first, never overwritten.
  const fs::path final_dir = dir / step_name(step);
  const fs::path displaced = dir / (".old-" + step_name(step) + "-" + std::to_string(::getpid()));
  if (fs::exists(final_dir)) fs::rename(final_dir, displaced);
  fs::rename(temporary, final_dir);
  const fs::path latest_tmp = dir / ".latest.tmp";
  write_text_durably(latest_tmp, step_name(step) + "\n");
  fs::rename(latest_tmp, dir / "latest");
  fsync_path(dir);
  // Only now is the previous state garbage.
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const bool old_state = name.rfind("step-", 0) == 0 && name != step_name(step);
    if (old_state || name.rfind(".old-", 0) == 0) fs::remove_all(entry.path(), error);
  }
  return final_dir;
}

std::pair<fs::path, nlohmann::json> load_state_dir(const fs::path& dir) {
  std::error_code error;
  REMAT_CHECK(fs::is_directory(dir, error), "resume: '", dir.string(), "' is not a directory of saved state; pass the ",
              "directory a state was saved to.");
  const fs::path latest = dir / "latest";
  REMAT_CHECK(fs::exists(latest, error), "resume: '", dir.string(), "' holds no saved state (no 'latest' file).");
  std::string name;
  {
    std::ifstream in(latest);
    std::getline(in, name);
  }
  const fs::path state = dir / name;
  REMAT_CHECK(!name.empty() && name.find('/') == std::string::npos && fs::is_directory(state, error), "resume: '",
              latest.string(), "' names '", name, "', which is not a state directory; the state is corrupt.");
  nlohmann::json meta;
  try {
    std::ifstream in(state / "meta.json");
    meta = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    REMAT_CHECK(false, "resume: '", (state / "meta.json").string(), "' is not valid JSON (", e.what(),
                "); the state is corrupt.");
  }
  REMAT_CHECK(meta.is_object() && meta.contains("files") && meta["files"].is_object(), "resume: '",
              (state / "meta.json").string(), "' lists no files; the state is corrupt.");
  for (const auto& [file, info] : meta["files"].items()) {
    const fs::path path = state / file;
    REMAT_CHECK(fs::exists(path, error), "resume: state file '", path.string(), "' is missing.");
    const auto expected_bytes = info.value("bytes", static_cast<uint64_t>(0));
    const auto bytes = fs::file_size(path);
    REMAT_CHECK(bytes == expected_bytes, "resume: state file '", path.string(), "' has ", bytes, " bytes but ",
                expected_bytes, " were written: it is truncated or was changed. Resume from another copy.");
    REMAT_CHECK(fnv1a64(path) == info.value("fnv1a64", std::string()), "resume: state file '", path.string(),
                "' does not match its checksum: it is corrupt. Resume from another copy.");
  }
  return {state, meta};
}

}  // namespace remat::train
