// `remat profile`: the GPT's measured per-stage costs (time, bytes kept, transients), the input of
// the planner; saved, they let `remat plan --profile` and `remat bench --profile` plan again
// without measuring.
#include <iostream>
#include <memory>

#include "commands.h"
#include "model_flags.h"
#include "planning.h"

namespace remat::cli {
namespace {

struct ProfileFlags {
  ModelFlags model;
  PlanningFlags planning;
  std::string save_file;
  bool json = false;
};

}  // namespace

void add_profile_command(CLI::App& app) {
  auto flags = std::make_shared<ProfileFlags>();
  CLI::App* cmd = app.add_subcommand("profile", "Measure the GPT's per-stage costs (time, bytes kept, transients)");
  flags->model.add_to(*cmd, ModelUse::run, "Text file to take the profiled batch from, instead of the fortunes corpus");
  flags->planning.add_to(*cmd, /*plans=*/false);
  cmd->add_option("--save-profile", flags->save_file, "Write the profile as JSON to this file (for --profile FILE)")
      ->group("Output");
  add_checkpoint_mode_option(*cmd, flags->model.checkpoint_mode,
                             "Cost segment ends for this mode: reentrant (the GPT's graph-only stages), non-reentrant "
                             "(the generic early stop: each stage's forward stopped at its last saved tensor)");
  add_json_flag(*cmd, flags->json);
  cmd->callback([flags] {
    flags->model.apply_preset();
    refuse_output_over_input({{"--data", flags->model.options.data_file}}, "--save-profile", flags->save_file);
    std::ostream& out = human_output(flags->json);
    const ModelCosts costs = profile_model(flags->model.options, flags->planning.repeats, flags->model.checkpoint_mode);
    out << costs.half.to_table();
    if (!flags->save_file.empty()) {
      save_profile(costs, flags->save_file);
      out << "saved to " << flags->save_file << "\n";
    }
    if (flags->json) std::cout << costs.half.to_json() << "\n";
  });
}

}  // namespace remat::cli
