#include "model_flags.h"

#include "remat/error.h"

namespace remat::cli {

void ModelFlags::add_to(CLI::App& command) {
  app = &command;
  auto& m = options.model;
  command.add_option("--preset", preset, "demo: a small GPT that learns in a minute; reference: the reference workload")
      ->check(CLI::IsMember({"demo", "reference"}))->group("Model");
  command.add_option("--layers", m.layers, "Transformer blocks")->capture_default_str()->group("Model");
  command.add_option("--hidden", m.hidden, "Hidden size (channels)")->capture_default_str()->group("Model");
  command.add_option("--heads", m.heads, "Attention heads (must divide --hidden)")->capture_default_str()->group("Model");
  command.add_option("--seq", m.sequence, "Sequence length in bytes")->capture_default_str()->group("Model");
  command.add_option("--dropout", m.dropout, "Dropout probability")->capture_default_str()->group("Model");
  command.add_option("--batch", options.batch, "Sequences per step")->capture_default_str()->group("Training");
  command.add_option("--threads", options.threads, "CPU threads (OpenBLAS's when present, see remat/cpu_threads.h)")->capture_default_str()->group("Training");
  command.add_option("--seed", options.seed, "Seed of initialisation, dropout and batches")->capture_default_str()->group("Training");
}

void ModelFlags::apply_preset() {
  if (preset.empty()) return;
  auto set = [&](const char* flag, auto& field, auto value) {
    const CLI::Option* option = app->get_option_no_throw(flag);
    if (option == nullptr || option->count() == 0) field = value;
  };
  auto& m = options.model;
  if (preset == "demo") {
    set("--layers", m.layers, 4);
    set("--hidden", m.hidden, 128);
    set("--heads", m.heads, 4);
    set("--seq", m.sequence, 128);
    set("--batch", options.batch, 8);
    set("--dropout", m.dropout, 0.1);
    set("--steps", options.steps, 300);
    set("--lr", options.lr, 2e-3);
    set("--warmup", options.warmup_steps, 30);
  } else if (preset == "reference") {
    set("--layers", m.layers, 8);
    set("--hidden", m.hidden, 256);
    set("--heads", m.heads, 8);
    set("--seq", m.sequence, 256);
    set("--batch", options.batch, 8);
    set("--dropout", m.dropout, 0.1);
  } else {
    REMAT_CHECK(false, "unknown preset '", preset, "'; use demo or reference.");
  }
}

}  // namespace remat::cli
