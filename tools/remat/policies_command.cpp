// `remat policies`: the checkpointing policies the GPT offers and what each trades.
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "model_flags.h"
#include "remat/models/gpt_policies.h"
#include "remat/internal/table.h"

namespace remat::cli {

void add_policies_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("policies", "List the checkpointing policies and their trade-offs");
  add_json_flag(*cmd, *json);
  cmd->callback([json] {
    Table table({{"policy", "policy"}, {"tradeoff", "trade-off"}});
    for (const auto& p : models::gpt_policy_descriptions()) table.add_row({p.name, p.tradeoff});
    if (*json) {
      std::cout << nlohmann::json{{"policies", table.json()}}.dump(2) << "\n";
    } else {
      table.print(std::cout);
    }
  });
}

}  // namespace remat::cli
