#include "remat/train/corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <cerrno>
#include <cstring>

#include <ATen/ops/empty.h>

#include "remat/base/error.h"

namespace remat::train {

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REMAT_CHECK(in.good(), "cannot read '", path.string(), "': ", std::strerror(errno), ".");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace

Corpus Corpus::from_fortunes(const std::string& directory) {
  std::error_code error;
  REMAT_CHECK(fs::is_directory(directory, error), "the default corpus directory '", directory,
              "' does not exist. Install Debian's `fortunes` package (scripts/setup.sh does) or set ",
              field("TrainOptions::data_file"), " to a text file.");
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(directory)) {
    const auto ext = entry.path().extension().string();
    if (entry.is_regular_file() && !entry.is_symlink() && ext != ".dat" && ext != ".u8") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());  // a fixed order: the same corpus bytes on every machine
  Corpus corpus;
  for (const auto& f : files) corpus.bytes_ += read_file(f);
  corpus.source_ = directory + " (" + std::to_string(files.size()) + " files)";
  REMAT_CHECK(!corpus.bytes_.empty(), "the default corpus directory '", directory,
              "' holds no fortune files. Install Debian's `fortunes` package or set ", field("TrainOptions::data_file"),
              " to a text file.");
  return corpus;
}

Corpus Corpus::from_file(const std::string& path) {
  std::error_code error;
  REMAT_CHECK(fs::exists(path, error), "data file '", path, "' does not exist; ", field("TrainOptions::data_file"),
              " takes a text file to train on.");
  REMAT_CHECK(fs::is_regular_file(path, error), "data path '", path, "' is not a regular file.");
  Corpus corpus;
  corpus.bytes_ = read_file(path);
  corpus.source_ = path;
  REMAT_CHECK(!corpus.bytes_.empty(), "data file '", path, "' is empty; give a text file with some content.");
  return corpus;
}

BatchSampler::BatchSampler(const Corpus& corpus, int64_t batch, int64_t sequence, uint64_t seed,
                           std::vector<int64_t> lengths)
    : corpus_(corpus), batch_(batch), sequence_(sequence), lengths_(std::move(lengths)), engine_(seed) {
  for (const int64_t length : lengths_) {
    REMAT_CHECK(length >= 1 && length <= sequence, "a sequence length of ", length, " lies outside [1, ",
                field("GptConfig::sequence"), " = ", sequence, "].");
  }
  REMAT_CHECK(static_cast<int64_t>(corpus.bytes().size()) >= sequence + 1, "the corpus (", corpus.source(), ") has ",
              corpus.bytes().size(), " bytes, fewer than one training window of ", field("GptConfig::sequence"),
              " + 1 = ", sequence + 1, " bytes. Use a larger ", field("TrainOptions::data_file"), " or a smaller ",
              field("GptConfig::sequence"), ".");
}

std::pair<at::Tensor, at::Tensor> BatchSampler::next() {
  const auto& bytes = corpus_.bytes();
  const int64_t sequence = lengths_.empty() ? sequence_
                                            : lengths_[static_cast<size_t>(std::uniform_int_distribution<int64_t>(
                                                  0, static_cast<int64_t>(lengths_.size()) - 1)(engine_))];
  std::uniform_int_distribution<int64_t> offset(0, static_cast<int64_t>(bytes.size()) - sequence - 1);
  at::Tensor tokens = at::empty({batch_, sequence}, at::kLong);
  at::Tensor targets = at::empty({batch_, sequence}, at::kLong);
  auto* t = tokens.data_ptr<int64_t>();
  auto* y = targets.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t start = offset(engine_);
    for (int64_t i = 0; i < sequence; ++i) {
      t[b * sequence + i] = static_cast<unsigned char>(bytes[start + i]);
      y[b * sequence + i] = static_cast<unsigned char>(bytes[start + i + 1]);
    }
  }
  return {tokens, targets};
}

std::string BatchSampler::state() const {
  std::ostringstream os;
  os << engine_;
  return os.str();
}

void BatchSampler::set_state(const std::string& state) {
  std::istringstream is(state);
  is >> engine_;
  REMAT_CHECK(!is.fail(), "the saved batch sampler state is corrupt.");
}

}  // namespace remat::train
