#include "remat/models/gpt_granularity.h"

#include "remat/base/error.h"

namespace remat::models {

std::string to_string(GptGranularity granularity) { return granularity == GptGranularity::half ? "half" : "block"; }

GptGranularity parse_gpt_granularity(const std::string& name, const std::string& source) {
  for (const GptGranularity g : {GptGranularity::block, GptGranularity::half}) {
    if (name == to_string(g)) return g;
  }
  REMAT_CHECK(false, source, ": granularity '", name.size() > 40 ? name.substr(0, 37) + "..." : name,
              "' is not one a GPT chain offers: 'block' (whole blocks) or 'half' (attention and MLP halves).");
  return GptGranularity::block;
}

GptGranularity gpt_granularity_of(const Plan& plan) { return parse_gpt_granularity(plan.granularity, "the plan"); }

}  // namespace remat::models
