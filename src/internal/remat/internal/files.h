// remat/internal/files.h — files written so that a crash or a full disk loses nothing: readers see either
// the old file or the whole new one. Plans, profiles, reports and saved training state all go
// through here.
//
//   remat::write_file_atomically("plan.json", plan.to_json());
#pragma once

#include <cstdint>
#include <string>

namespace remat {

/// What a symbolic link at the path written names: for a file the user named, `follow_link` (the
/// file it names is replaced); for a name inside a folder the program owns (a saved state's
/// `latest`), `replace_name` (the link itself is replaced, whatever it points at, and so is a
/// FIFO or other non-folder planted there: the name is the program's, not the user's).
enum class AtPath { follow_link, replace_name };

/// Writes `text` to a temporary beside `path` (a name of its own per process and call), flushes it
/// to disk, renames it over `path` and flushes the folder. A failed write removes the temporary,
/// leaves `path` as it was, and throws an error saying why. Only regular files are written: a
/// device node, FIFO, socket or folder at `path` is refused (a rename would replace it); a
/// symbolic link is followed, and the file it names is replaced, keeping its permissions.
void write_file_atomically(const std::string& path, const std::string& text, AtPath at_path = AtPath::follow_link);

/// Reads a whole regular file of at most `max_bytes`; `what` names it in errors ("the profile").
/// A FIFO, device or folder is refused without reading from it (a FIFO would block, /dev/zero
/// never end), and so is a larger file, before anything is allocated.
std::string read_regular_file(const std::string& path, const std::string& what, int64_t max_bytes = int64_t{64} << 20);

/// What a file of this st_mode is, for messages: "a folder", "a FIFO", "a character device", ...
const char* file_kind(unsigned mode);

/// Flushes a file or a directory (its entries: a rename into it) to disk; quietly does nothing
/// where the system cannot.
void sync_to_disk(const std::string& path);

}  // namespace remat
