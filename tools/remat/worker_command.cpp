// `remat worker`: builds the GPT and one batch, exports both for another runtime (torch.load-able),
// then answers JSON requests on stdin, one line each, with measured training steps:
//
//   > {"policy": "block", "steps": 1, "seed": 7, "trace": "block.csv"}
//   < {"policy": "block", "plan": "embed [block0] ...", "seconds": [...], "activation_peak_bytes": [...], "loss": [...]}
//   > {"plan": {...remat plan --json's "plan_json"...}, "seed": 7}
//   < {"plan": "embed [attn0 mlp0:lean] ...", "seconds": [...], ...}
//
// A plan request runs any plan of this GPT (the planner's, or one saved by `remat plan --save`),
// checked against the chain of its granularity first; the ready line lists the request kinds.
// A driver in Python interleaves these steps with its own, so both runtimes see the same machine
// drift; each step re-seeds the generator so dropout masks match the driver's for the same seed.
// Its stdout is JSON Lines always (one document per line: the ready line, then one per request);
// --json is accepted, like every subcommand's, and changes nothing.
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>
#include <torch/serialize.h>

#include "base/json_nesting.h"
#include "commands.h"
#include "model_flags.h"
#include "planning.h"
#include "remat/models/gpt_policies.h"
#include "remat/base/error.h"
#include "remat/internal/files.h"
#include "remat/memory/memory.h"
#include "remat/memory/memory_timeline.h"
#include "remat/models/gpt.h"
#include "remat/chain/policies.h"

namespace remat::cli {
namespace {

struct WorkerFlags {
  ModelFlags model;
  std::string export_file;
  bool json = false;
};

void export_model_and_batch(const SampleModel& sample, const std::string& path) {
  c10::impl::GenericDict weights(c10::StringType::get(), c10::TensorType::get());
  for (const auto& p : sample.model->named_parameters()) weights.insert(p.key(), p.value().detach());
  c10::impl::GenericDict everything(c10::StringType::get(), c10::AnyType::get());
  everything.insert("weights", weights);
  everything.insert("tokens", sample.tokens);
  everything.insert("targets", sample.targets);
  const std::vector<char> bytes = torch::pickle_save(everything);
  write_file_atomically(path, std::string(bytes.begin(), bytes.end()));
}

class StepServer {
 public:
  explicit StepServer(const SampleModel& sample) : sample_(sample), chains_(sample.model) {
    chains_.set_targets(sample.targets);
  }

  nlohmann::json answer(const nlohmann::json& request) {
    REMAT_CHECK(request.is_object() && (request.contains("policy") != request.contains("plan")),
                "a request is a JSON object with either a \"policy\" name or a \"plan\" (remat's plan JSON), as in ",
                "{\"policy\": \"block\", \"steps\": 1}.");
    const auto& steps_json = request.contains("steps") ? request["steps"] : nlohmann::json(1);
    REMAT_CHECK(steps_json.is_number_integer() && steps_json.get<int64_t>() >= 1 && steps_json.get<int64_t>() <= 1000,
                "\"steps\" must be a whole number in [1, 1000], got ", steps_json.dump(), ".");
    const int steps = static_cast<int>(steps_json.get<int64_t>());
    const auto& seed_json = request.contains("seed") ? request["seed"] : nlohmann::json(0);
    REMAT_CHECK(seed_json.is_number_unsigned() || (seed_json.is_number_integer() && seed_json.get<int64_t>() >= 0),
                "\"seed\" must be a whole number >= 0, got ", seed_json.dump(), ".");
    const uint64_t seed = seed_json.get<uint64_t>();
    const auto& trace_json = request.contains("trace") ? request["trace"] : nlohmann::json("");
    REMAT_CHECK(trace_json.is_string(), "\"trace\" must be a file name, got ", trace_json.dump(), ".");
    const std::string trace = trace_json.get<std::string>();
    auto [chain, plan] = request.contains("policy") ? policy_plan(request["policy"]) : requested_plan(request["plan"]);
    nlohmann::json reply = {{"plan", plan.to_string()},
                            {"seconds", nlohmann::json::array()},
                            {"activation_peak_bytes", nlohmann::json::array()},
                            {"loss", nlohmann::json::array()}};
    if (request.contains("policy")) reply["policy"] = request["policy"];
    for (int s = 0; s < steps; ++s) {
      std::unique_ptr<MemoryTimeline> timeline;
      if (!trace.empty() && s + 1 == steps) timeline = std::make_unique<MemoryTimeline>(c10::kCPU);
      const SeededStep step = seeded_step(sample_, *chain, plan, seed);
      if (timeline) write_memory_events_csv(timeline->stop(), trace);
      reply["seconds"].push_back(step.measurement.step_seconds);
      reply["activation_peak_bytes"].push_back(step.measurement.activation_peak_bytes());
      reply["loss"].push_back(step.loss);
    }
    return reply;
  }

 private:
  // The request's plan on the chain of its granularity, chosen as every subcommand chooses one.
  std::pair<models::GptChain*, Plan> chosen(const PlanRequest& request) {
    models::GptChain& chain = chains_.of(models::gpt_request_granularity(request));
    Plan plan = make_plan(request, models::gpt_plan_subject(chain.model()->config().layers())).plan;
    plan.bind_to(chain);
    return {&chain, std::move(plan)};
  }

  std::pair<models::GptChain*, Plan> policy_plan(const nlohmann::json& policy_json) {
    REMAT_CHECK(policy_json.is_string(), "\"policy\" must be a policy name (remat policies lists them), got ",
                policy_json.dump(), ".");
    return chosen(PlanRequest::of_policy(policy_json.get<std::string>()));
  }

  std::pair<models::GptChain*, Plan> requested_plan(const nlohmann::json& plan_json) {
    REMAT_CHECK(plan_json.is_object(), "\"plan\" must be a plan as a JSON object (remat plan --json's \"plan_json\"), ",
                "got ", plan_json.dump().substr(0, 80), ".");
    return chosen(PlanRequest::of_plan(Plan::from_json(plan_json.dump(), "the request's plan"), "the request's plan"));
  }

  SampleModel sample_;
  models::GptChains chains_;
};

void run_worker(WorkerFlags& flags) {
  flags.model.apply_preset();
  refuse_output_over_input({{"--data", flags.model.options.data_file}}, "--export", flags.export_file);
  install_cpu_memory_tracker();
  const SampleModel sample = make_sample_model(flags.model.options);
  export_model_and_batch(sample, flags.export_file);
  StepServer server(sample);
  std::cout << nlohmann::json{{"ready", true},
                              {"export", flags.export_file},
                              {"parameters", sample.model->parameters().size()},
                              {"requests", nlohmann::json::array({"policy", "plan"})}}
                   .dump()
            << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json reply;
    try {
      // A request wraps a plan in one object: refused deeper than any plan before it is parsed
      // (its dump() for Plan::from_json would recurse once per level).
      check_json_nesting(line, "request", 2 * Plan::kMaxNesting + 4, "one JSON object per line");
      reply = server.answer(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception& e) {
      reply = {{"error", std::string("malformed request: ") + e.what()}};
    } catch (const c10::Error& e) {
      reply = {{"error", e.what_without_backtrace()}};
    } catch (const std::exception& e) {
      reply = {{"error", e.what()}};
    }
    std::cout << reply.dump() << std::endl;
  }
}

}  // namespace

void add_worker_command(CLI::App& app) {
  auto flags = std::make_shared<WorkerFlags>();
  CLI::App* worker = app.add_subcommand(
      "worker",
      "Export the GPT and a batch, then run measured steps requested as JSON lines on stdin (for bench scripts)");
  flags->model.add_to(*worker, ModelUse::run, "Text file to take the batch from, instead of the fortunes corpus");
  worker->add_option("--export", flags->export_file, "Write weights, tokens and targets to this file (torch.load-able)")
      ->required()
      ->group("Output");
  add_json_flag(*worker, flags->json)->description("Accepted for uniformity: the worker's stdout is always JSON Lines");
  worker->callback([flags] { run_worker(*flags); });
}

}  // namespace remat::cli
