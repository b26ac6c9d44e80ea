// The one progress display of the CLI, on stderr (stdout stays for results and --json): a bar
// rewritten in place when stderr is a terminal, plain lines otherwise (logs, CI), at most
// `plain_lines` of them per run so a long run's log stays short.
//
//   Progress progress("train", steps);
//   for (...) progress.update(i + 1, "loss 2.31, 5400 tok/s");
//   progress.done();
#pragma once

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>

#include <unistd.h>

namespace remat::cli {

class Progress {
 public:
  Progress(std::string label, int64_t total, int64_t plain_lines = 10)
      : label_(std::move(label)),
        total_(total),
        terminal_(isatty(STDERR_FILENO) != 0),
        plain_every_(total > plain_lines && plain_lines > 0 ? total / plain_lines : 1) {}
  ~Progress() { done(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// `done` of `total` finished; `text` says what the latest one was.
  void update(int64_t done, const std::string& text) {
    if (terminal_) {
      const int64_t width = 24, filled = total_ > 0 ? width * std::min(done, total_) / total_ : width;
      std::cerr << "\r\033[K[" << std::string(static_cast<size_t>(filled), '#')
                << std::string(static_cast<size_t>(width - filled), '.') << "] " << label_ << " " << done << "/"
                << total_ << "  " << text << std::flush;
      open_ = true;
    } else if (done == 1 || done == total_ || done % plain_every_ == 0) {
      std::cerr << label_ << " " << done << "/" << total_ << "  " << text << "\n";
    }
  }
  /// Clears the bar (a terminal), so what follows starts on a clean line.
  void done() {
    if (open_) std::cerr << "\r\033[K" << std::flush;
    open_ = false;
  }

 private:
  std::string label_;
  int64_t total_;
  bool terminal_;
  int64_t plain_every_;
  bool open_ = false;
};

}  // namespace remat::cli
