// `remat policies` lists the policies; `remat plan` shows the plan a policy makes for a model and
// saves it as JSON for `remat train --plan`.
#include "plan_command.h"

#include <fstream>
#include <iostream>

#include "model_flags.h"
#include "remat/error.h"
#include "remat/models/gpt.h"
#include "remat/policies.h"
#include "table.h"

namespace remat::cli {
namespace {

struct PlanFlags {
  ModelFlags model;
  std::string policy = "block";
  std::string save_file;
  bool json = false;
};

void run_plan_command(PlanFlags& flags) {
  flags.model.apply_preset();
  const auto& config = flags.model.options.model;
  config.validate();
  const std::string granularity = policy_granularity(flags.policy);
  models::GptChain chain(models::Gpt(config), granularity);
  const Plan plan = policy_plan(flags.policy, chain);
  if (flags.json) {
    std::cout << plan.to_json() << "\n";
  } else {
    std::cout << "policy " << flags.policy << " for a GPT with " << config.describe() << " (" << chain.size()
              << " stages, granularity " << granularity << "):\n  " << plan.to_string() << "\n";
  }
  if (!flags.save_file.empty()) {
    const std::string temporary = flags.save_file + ".tmp";
    {
      std::ofstream out(temporary, std::ios::trunc);
      out << plan.to_json() << "\n";
      REMAT_CHECK(out.good(), "cannot write '", temporary, "'.");
    }
    REMAT_CHECK(std::rename(temporary.c_str(), flags.save_file.c_str()) == 0, "cannot replace '", flags.save_file, "'.");
    if (!flags.json) std::cout << "saved to " << flags.save_file << "\n";
  }
}

}  // namespace

void add_plan_commands(CLI::App& app) {
  CLI::App* policies = app.add_subcommand("policies", "List the checkpointing policies and their trade-offs");
  policies->callback([] {
    Table table({"policy", "trade-off"});
    for (const auto& p : policy_descriptions()) table.add_row({p.name, p.tradeoff});
    table.print(std::cout);
  });

  auto flags = std::make_shared<PlanFlags>();
  CLI::App* plan = app.add_subcommand("plan", "Show (and save) the plan a policy makes for a GPT");
  flags->model.add_to(*plan);
  plan->add_option("--policy", flags->policy, "Checkpointing policy (see `remat policies`)")->capture_default_str();
  plan->add_option("--save", flags->save_file, "Write the plan as JSON to this file (for `remat train --plan`)");
  plan->add_flag("--json", flags->json, "Print the plan as JSON");
  plan->callback([flags] { run_plan_command(*flags); });
}

}  // namespace remat::cli
