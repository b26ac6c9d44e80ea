#include "remat/models/gpt_planning.h"

#include "remat/base/error.h"
#include "remat/models/estimator.h"
#include "remat/models/gpt_policies.h"
#include "remat/measure/profiler.h"

namespace remat::models {

Prediction GptCosts::predict(const Plan& plan) const { return simulate(to_half_granularity(plan), half); }

Prediction GptCosts::unchecked() const {
  return simulate(Plan::unchecked(GptChainShape(layers(), GptGranularity::half)), half);
}

GptCosts profile_gpt(Gpt model, const at::Tensor& tokens, const at::Tensor& targets, const ProfileOptions& options,
                     CheckpointMode mode) {
  GptChain chain(std::move(model), GptGranularity::half);
  chain.set_targets(targets);
  return GptCosts{profile_chain(chain, tokens, options, mode)};
}

GptCosts gpt_costs_from_json(const std::string& text, const std::string& source) {
  GptCosts costs{CostTable::from_json(text, source)};
  REMAT_CHECK(costs.half.granularity == to_string(GptGranularity::half) && costs.half.stages.size() >= 4 &&
                  costs.half.stages.size() % 2 == 0,
              source,
              ": not a half-block cost table of a GPT (granularity 'half': embed, attention and MLP halves, head).");
  const GptChainShape shape(costs.layers(), GptGranularity::half);
  costs.half.validate_against(shape);
  bool blocks_given = false;
  for (const auto& stage : costs.half.stages) blocks_given = blocks_given || stage.block >= 0;
  if (!blocks_given) {  // a profile written before tables recorded blocks
    for (size_t i = 0; i < costs.half.stages.size(); ++i) costs.half.stages[i].block = shape.stages()[i].block;
  }
  return costs;
}

void check_gpt_costs(const GptCosts& costs, const GptConfig& config, int64_t batch, const std::string& source) {
  REMAT_CHECK(costs.layers() == config.layers(), source, ": describes a model with ", costs.layers(), " layers but ",
              field("GptConfig::layers"), " is ", config.layers(), ".");
  const int64_t boundary = batch * config.sequence() * config.hidden() * 4;  // fp32 (B,T,C)
  REMAT_CHECK(costs.half.stages.front().output_bytes == boundary, source,
              ": was made for another model or batch: its activations between stages are ",
              costs.half.stages.front().output_bytes, " bytes, but ", field("batch"), " ", batch, " x ",
              field("GptConfig::sequence"), " ", config.sequence(), " x ", field("GptConfig::hidden"), " ",
              config.hidden(), " x 4 bytes = ", boundary, ". Profile this model and batch again.");
}

GptGranularity gpt_request_granularity(const PlanRequest& request) {
  switch (request.kind()) {
    case PlanRequest::Kind::policy:
      return gpt_policy_granularity(request.name());
    case PlanRequest::Kind::budget:
      return GptGranularity::half;
    case PlanRequest::Kind::plan:
      break;
  }
  return parse_gpt_granularity(request.plan().granularity, request.name());
}

namespace {

// The GPT's policies, and plans checked against its chain of the plan's granularity.
PlanSubject with_gpt_policies(PlanSubject subject, int64_t layers) {
  return subject.policies([layers](const std::string& policy) { return gpt_policy_plan(policy, layers); })
      .check_plans(
          [layers](const Plan& plan) { plan.validate_against(GptChainShape(layers, gpt_granularity_of(plan))); });
}

}  // namespace

PlanSubject gpt_plan_subject(int64_t layers) { return with_gpt_policies(PlanSubject(), layers); }

PlanSubject gpt_plan_subject(const GptCosts& costs) {
  return with_gpt_policies(PlanSubject(costs.half), costs.layers());
}

PlanSubject gpt_plan_subject(Gpt model, at::Tensor tokens, at::Tensor targets) {
  const int64_t layers = model->config().layers();
  auto chain = std::make_shared<GptChain>(std::move(model), GptGranularity::half);
  chain->set_targets(std::move(targets));
  return with_gpt_policies(PlanSubject(std::move(chain), std::move(tokens)), layers);
}

ProfiledBatches profile_gpt_batches(Gpt model, const at::Tensor& tokens, const at::Tensor& targets,
                                    const std::vector<int64_t>& batches, const ProfileOptions& options,
                                    CheckpointMode mode) {
  for (const int64_t b : batches) {
    REMAT_CHECK(b >= 1 && b <= tokens.size(0), "profile_gpt_batches: batch size ", b, " is not within the ",
                tokens.size(0), " sequences given.");
  }
  GptChain chain(std::move(model), GptGranularity::half);
  return profile_batches(
      chain,
      [&](int64_t b) {
        chain.set_targets(targets.narrow(0, 0, b));  // the loss of this batch size
        return tokens.narrow(0, 0, b);
      },
      batches, options, mode);
}

std::vector<std::string> gpt_policy_names() {
  // The generic list, then the GPT's own: half-block segments and what a block keeps inside.
  std::vector<std::string> names = generic_policy_names();
  for (const char* half : {"ffn", "attn", "ffn+attn"}) names.emplace_back(half);
  for (const auto& o : keep_options()) {
    if (o.keep != Keep::full) names.emplace_back(o.name);  // the option policies
  }
  return names;
}

std::vector<std::string> gpt_policy_candidates() { return with_and_without_skip_ends(gpt_policy_names()); }

std::vector<PlanResult> gpt_compare_planners(const GptCosts& costs, const Budget& budget,
                                             const PlannerOptions& options) {
  const int64_t layers = costs.layers();
  return compare_planners(
      costs.half, budget, gpt_policy_candidates(),
      [layers](const std::string& policy) { return gpt_policy_plan(policy, layers); },
      [&costs](const Plan& plan) { return costs.predict(plan); }, options);
}

std::vector<PlanMeasurement> gpt_measure_plans(Gpt model, const std::vector<Plan>& plans, const at::Tensor& tokens,
                                               const at::Tensor& targets, int steps, const MeasureProgress& progress) {
  GptChains chains(std::move(model));
  chains.set_targets(targets);
  return measure_plans([&](const Plan& plan) -> Chain& { return chains.of(plan); }, plans, tokens, steps, progress);
}

std::vector<PlanMeasurement> gpt_measure_micro_batches(Gpt model, const std::vector<MicroBatchRun>& runs,
                                                       const at::Tensor& tokens, const at::Tensor& targets, int steps,
                                                       const MeasureProgress& progress) {
  GptChains chains(std::move(model));
  std::vector<PlanRun> on_chains;
  for (const auto& run : runs) {
    REMAT_CHECK(run.micro_batch >= 1 && run.micro_batch <= tokens.size(0), "gpt_measure_micro_batches: micro-batch ",
                run.micro_batch, " is not between 1 and the batch given, ", tokens.size(0), ".");
    GptChain* chain = &chains.of(run.plan);
    // A GptChain holds its batch's targets: each step sets those of its micro-batch.
    at::Tensor micro_targets = targets.narrow(0, 0, run.micro_batch);
    chain->set_targets(micro_targets);
    on_chains.push_back({chain, run.plan, tokens.narrow(0, 0, run.micro_batch),
                         [chain, micro_targets] { chain->set_targets(micro_targets); }});
  }
  return measure_runs(on_chains, steps, progress);
}

}  // namespace remat::models
