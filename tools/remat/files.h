// Files the CLI writes: atomically (a temporary next to the target, then a rename), so a crash or
// a full disk leaves the previous file whole rather than half a new one.
#pragma once

#include <cstdio>
#include <fstream>
#include <string>

#include "remat/error.h"

namespace remat::cli {

inline void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    REMAT_CHECK(out.good(), "cannot write '", temporary, "': check that its folder exists and is writable.");
    out << text;
    REMAT_CHECK(out.good(), "cannot write '", temporary, "' (disk full?).");
  }
  REMAT_CHECK(std::rename(temporary.c_str(), path.c_str()) == 0, "cannot replace '", path, "'.");
}

}  // namespace remat::cli
