#include "remat/train/presets.h"

#include "remat/base/error.h"

namespace remat::train {
namespace {

models::GptConfig gpt(int64_t layers, int64_t hidden, int64_t heads, int64_t sequence, int64_t vocabulary, double dropout) {
  models::GptConfig c;
  c.layers(layers).hidden(hidden).heads(heads).sequence(sequence).vocabulary(vocabulary).dropout(dropout);
  return c;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> all = [] {
    std::vector<Preset> p;
    p.push_back({"demo", "a small GPT that learns in a minute (4 layers, hidden 128, seq 128, 300 steps)", true,
                 gpt(4, 128, 4, 128, 256, 0.1), 8, 300, 2e-3, 30, "fp32"});
    p.push_back({"reference", "the reference workload (8 layers, hidden 256, 8 heads, seq 256, batch 8)", true,
                 gpt(8, 256, 8, 256, 256, 0.1), 8, std::nullopt, std::nullopt, std::nullopt, "fp32"});
    // LLaMA-like shapes (no dropout in the published models; remat's GPT keeps dropout in its
    // count, as Korthikanti et al. do, so the estimate matches their formula).
    p.push_back({"7b", "a 7B-class config for estimates (32 layers, hidden 4096, 32 heads, seq 2048, batch 1, bf16)",
                 false, gpt(32, 4096, 32, 2048, 32000, 0.1), 1, std::nullopt, std::nullopt, std::nullopt, "bf16"});
    p.push_back({"13b", "a 13B-class config for estimates (40 layers, hidden 5120, 40 heads, seq 2048, batch 1, bf16)",
                 false, gpt(40, 5120, 40, 2048, 32000, 0.1), 1, std::nullopt, std::nullopt, std::nullopt, "bf16"});
    return p;
  }();
  return all;
}

std::string preset_names() {
  std::string names;
  for (const auto& p : presets()) names += (names.empty() ? "" : ", ") + p.name;
  return names;
}

const Preset& preset(const std::string& name) {
  for (const auto& p : presets()) {
    if (p.name == name) return p;
  }
  REMAT_CHECK(false, "unknown preset '", name, "'; the presets are ", preset_names(), ".");
  return presets().front();  // not reached
}

}  // namespace remat::train
