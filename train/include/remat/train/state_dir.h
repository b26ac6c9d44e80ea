// Saved training state on disk, written so that a crash at any moment loses nothing.
//
//   DIR/latest              the name of the newest complete state ("step-000040"), replaced atomically
//   DIR/step-000040/        one complete state: the files the trainer writes, plus meta.json
//                           holding the size and FNV-1a checksum of each of them, and its own
//                           checksum (meta_fnv1a64)
//   DIR/step-000020/        an older state, kept when save_state_dir is asked to keep more than one
//   DIR/step-000040.1/      a second save of step 40 (a resumed run saved again): never over the first
//
// A state is written into a temporary directory, flushed, renamed into place, and only then does
// `latest` (written to a temporary file and renamed over) point at it; states beyond the newest
// `keep_last` go last. Temporaries left by a save that died are removed by the next save.
// Loading checks every file's size and checksum before anything is read into the model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace remat::train {

/// Writes a state: `write_files(directory)` writes its files into `directory`; `meta` is stored
/// as meta.json with the checksums added. Keeps this state and the `keep_last - 1` newest older
/// ones, removing the rest. Returns the state's directory.
std::filesystem::path save_state_dir(const std::filesystem::path& dir, int64_t step, nlohmann::json meta,
                                     const std::function<void(const std::filesystem::path&)>& write_files,
                                     int keep_last = 1);

/// Finds the newest complete state in `dir`, verifies its files, and returns its directory and
/// meta.json. Throws a clear error for a missing, truncated or corrupt state.
std::pair<std::filesystem::path, nlohmann::json> load_state_dir(const std::filesystem::path& dir);

/// Creates `dir` if needed and checks that files can be written in it: a clear error before a run
/// whose state could not be saved at its end.
void check_state_dir_writable(const std::filesystem::path& dir);

/// FNV-1a (64 bits) of `bytes`, as hex: the checksum of state files, for other contents (the corpus).
std::string fnv1a64_of(const std::string& bytes);

/// Test hook: the next save_state_dir kills its process (SIGKILL) just before its `operation`-th
/// file operation (1-based; 0 turns the hook off), so tests can interrupt a save between any two.
void crash_state_save_before_operation_for_testing(int operation);

}  // namespace remat::train
