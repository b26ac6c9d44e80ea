// remat/train/config_json.h — the one JSON form of a GPT's configuration, shared by saved training
// state (whose resume check compares it), `remat train --json` and `remat bench`'s report.
#pragma once

#include <nlohmann/json.hpp>

#include "remat/models/gpt.h"

namespace remat::train {

/// {"layers", "hidden", "heads", "sequence", "vocabulary", "dropout"}: GptConfig's fields by name.
inline nlohmann::json gpt_config_json(const models::GptConfig& c) {
  return {{"layers", c.layers()},     {"hidden", c.hidden()},         {"heads", c.heads()},
          {"sequence", c.sequence()}, {"vocabulary", c.vocabulary()}, {"dropout", c.dropout()}};
}

}  // namespace remat::train
