// A byte-level text corpus and the random batches a training run draws from it.
//
// The default corpus is the English text of Debian's `fortunes` packages (fortune cookies: quotes,
// jokes, literature), read from /usr/share/games/fortunes. Tokens are bytes (vocabulary 256).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace remat::train {

/// The directory the default corpus is read from.
constexpr const char* kDefaultCorpusDir = "/usr/share/games/fortunes";

class Corpus {
 public:
  /// Every fortune text file in `directory` (skipping the .dat indexes and .u8 duplicates).
  static Corpus from_fortunes(const std::string& directory = kDefaultCorpusDir);
  /// One file, taken as bytes.
  static Corpus from_file(const std::string& path);

  const std::string& bytes() const { return bytes_; }
  const std::string& source() const { return source_; }

 private:
  std::string bytes_;
  std::string source_;
};

/// Draws (tokens, targets) windows of `sequence`+1 consecutive bytes at random offsets. Its state
/// is saved with a training run so a resumed run draws the batches the straight run would have.
/// With `lengths`, each batch's length is drawn first, uniformly from them (bucketed lengths: the
/// windows are cut from the running text at that length, never padded).
class BatchSampler {
 public:
  BatchSampler(const Corpus& corpus, int64_t batch, int64_t sequence, uint64_t seed, std::vector<int64_t> lengths = {});

  /// tokens (B,T) and targets (B,T) = tokens shifted by one byte, both int64.
  std::pair<at::Tensor, at::Tensor> next();

  std::string state() const;
  void set_state(const std::string& state);

 private:
  const Corpus& corpus_;
  int64_t batch_, sequence_;
  std::vector<int64_t> lengths_;
  std::mt19937_64 engine_;
};

}  // namespace remat::train
