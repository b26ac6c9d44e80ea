// The GPT chain's two granularities, in a header of their own: the policies and plans name them
// without the model's (heavy) module headers.
#pragma once

#include <string>

#include "remat/chain/plan.h"

namespace remat::models {

/// How finely the GPT's chain cuts a block: whole (one stage) or in halves (attention, MLP).
/// A Plan records it as the text to_string gives ("block", "half").
enum class GptGranularity { block, half };
std::string to_string(GptGranularity granularity);
/// `name` as a granularity; `source` names it in the error for anything but "block" or "half".
GptGranularity parse_gpt_granularity(const std::string& name, const std::string& source);
/// The granularity of the GPT chain `plan` was made for; a clear error if it is not a GPT's.
GptGranularity gpt_granularity_of(const Plan& plan);

}  // namespace remat::models
