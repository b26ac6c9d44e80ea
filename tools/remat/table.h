// A plain-text table for the CLI's reports: columns sized to their widest cell, numbers right-aligned.
#pragma once

#include <algorithm>
#include <cctype>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

namespace remat::cli {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add_row(std::vector<std::string> row) { rows_.push_back(std::move(row)); }

  void print(std::ostream& out) const {
    std::vector<size_t> width(header_.size(), 0);
    for (size_t c = 0; c < header_.size(); ++c) width[c] = header_[c].size();
    for (const auto& row : rows_) {
      for (size_t c = 0; c < row.size() && c < width.size(); ++c) width[c] = std::max(width[c], row[c].size());
    }
    // Columns of numbers align right, columns of words left.
    std::vector<bool> left(width.size(), false);
    for (const auto& row : rows_) {
      for (size_t c = 0; c < row.size() && c < left.size(); ++c) {
        const char first = row[c].empty() ? '0' : row[c][0];
        if (!(std::isdigit(static_cast<unsigned char>(first)) || first == '+' || first == '-' || first == '.')) left[c] = true;
      }
    }
    auto line = [&](const std::vector<std::string>& cells) {
      for (size_t c = 0; c < width.size(); ++c) {
        const std::string cell = c < cells.size() ? cells[c] : "";
        const bool last = c + 1 == width.size();
        const int pad = last && left[c] ? 0 : static_cast<int>(width[c]);  // no trailing blanks
        out << (c == 0 ? "" : "  ") << (left[c] ? std::left : std::right) << std::setw(pad) << cell;
      }
      out << std::right << "\n";
    };
    line(header_);
    size_t total = 0;
    for (size_t w : width) total += w + 2;
    out << std::string(total - 2, '-') << "\n";
    for (const auto& row : rows_) line(row);
  }

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

/// Formats a number with a fixed count of decimals.
inline std::string fixed(double value, int decimals) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(decimals) << value;
  return os.str();
}

/// "1.254 s", or "3.41 ms" below a tenth of a second.
inline std::string format_seconds(double seconds) {
  if (seconds >= 0.1) return fixed(seconds, 3) + " s";
  const double ms = seconds * 1e3;
  return fixed(ms, ms < 10 ? 2 : 1) + " ms";
}

inline std::string mib(int64_t bytes) { return fixed(static_cast<double>(bytes) / (1024.0 * 1024.0), 1); }

}  // namespace remat::cli
