#include "planning.h"

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

#include "files.h"
#include "remat/cpu_threads.h"
#include "remat/error.h"
#include "remat/models/estimator.h"
#include "remat/policies.h"
#include "remat/profiler.h"
#include "remat/train/corpus.h"
#include "remat/models/gpt.h"
#include "table.h"

namespace remat::cli {

Prediction ModelCosts::predict(const Plan& plan) const { return simulate(models::to_half_granularity(plan), half); }

Prediction ModelCosts::unchecked() const {
  models::GptChainShape chain(layers(), "half");
  return simulate(Plan::plain(chain), half);
}

SampleModel make_sample_model(const train::TrainOptions& options) {
  options.model.validate();
  set_cpu_threads(options.threads);
  const train::Corpus corpus = options.data_file.empty() ? train::Corpus::from_fortunes(options.corpus_dir)
                                                         : train::Corpus::from_file(options.data_file);
  train::BatchSampler sampler(corpus, options.batch, options.model.sequence, options.seed);
  SampleModel sample;
  std::tie(sample.tokens, sample.targets) = sampler.next();
  torch::manual_seed(options.seed);
  sample.model = models::Gpt(options.model);
  sample.model->train();
  return sample;
}

SeededStep seeded_step(SampleModel& sample, Chain& chain, const Plan& plan, uint64_t seed) {
  sample.model->zero_grad(/*set_to_none=*/false);
  torch::manual_seed(seed);
  at::Tensor loss;
  SeededStep step;
  step.measurement = measure_step([&] { return loss = run_plan(chain, plan, sample.tokens); });
  step.loss = loss.item<double>();
  return step;
}

ModelCosts profile_model(const train::TrainOptions& options, int repeats) {
  const SampleModel sample = make_sample_model(options);
  models::GptChain chain(sample.model, "half");
  chain.set_targets(sample.targets);
  return ModelCosts{profile_chain(chain, sample.tokens, ProfileOptions().repeats(repeats))};
}

void save_profile(const ModelCosts& costs, const std::string& path) {
  write_file_atomically(path, costs.half.to_json() + "\n");
}

ModelCosts load_profile(const std::string& path) {
  std::ifstream in(path);
  REMAT_CHECK(in.good(), "--profile: cannot read '", path, "'; write one with `remat profile --save FILE`.");
  std::ostringstream text;
  text << in.rdbuf();
  ModelCosts costs{CostTable::from_json(text.str(), path)};
  REMAT_CHECK(costs.half.granularity == "half" && costs.half.stages.size() >= 4 && costs.half.stages.size() % 2 == 0,
              "--profile: '", path, "' is not a half-block profile of a GPT (write one with `remat profile --save`).");
  costs.half.validate_against(models::GptChainShape(costs.layers(), "half"));
  return costs;
}

ModelCosts load_profile_for(const std::string& path, const train::TrainOptions& options) {
  ModelCosts costs = load_profile(path);
  REMAT_CHECK(costs.layers() == options.model.layers, "--profile: '", path, "' describes a model with ", costs.layers(),
              " layers but --layers is ", options.model.layers, ".");
  const int64_t boundary = options.batch * options.model.sequence * options.model.hidden * 4;  // fp32 (B,T,C)
  REMAT_CHECK(costs.half.stages.front().output_bytes == boundary, "--profile: '", path,
              "' was made for another model or batch: its activations between stages are ",
              costs.half.stages.front().output_bytes, " bytes, but --batch ", options.batch, " x --seq ",
              options.model.sequence, " x --hidden ", options.model.hidden, " x 4 bytes = ", boundary,
              ". Profile again with these flags (remat profile --save FILE), or give the profile's flags.");
  return costs;
}

PlanChoice optimal_plan(const ModelCosts& costs, int64_t budget_bytes, int64_t slots, int64_t* min_feasible_bytes) {
  models::GptChainShape chain(costs.layers(), "half");
  const Plan plain = Plan::plain(chain);
  // The table spans [0, budget]: its memory unit is budget/slots, so rounding costs at most a
  // slot per term of the recurrence, relative to the budget asked for.
  const OptimalPlanner planner(costs.half, plain, slots, std::max<int64_t>(budget_bytes, 1));
  const PlanResult r = planner.plan(budget_bytes);
  if (min_feasible_bytes != nullptr) {
    int64_t least = planner.min_feasible_budget_bytes();
    if (least < 0) {
      // Infeasible here: find the least budget on the whole range, then again on a finer grid.
      const OptimalPlanner coarse(costs.half, plain, slots, 2 * costs.unchecked_peak_bytes() + 1);  // rounding headroom
      least = coarse.min_feasible_budget_bytes();
      if (least > 0) {
        const int64_t refined = OptimalPlanner(costs.half, plain, slots, 2 * least).min_feasible_budget_bytes();
        if (refined > 0) least = std::min(least, refined);
      }
    }
    *min_feasible_bytes = least;
  }
  PlanChoice best;
  best.name = "optimal";
  best.feasible = r.feasible;
  best.plan = r.plan;
  best.prediction = r.prediction;
  return best;
}

std::vector<std::string> budget_list(const std::string& text) {
  std::vector<std::string> budgets;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (part.empty()) continue;
    parse_budget(part, int64_t{1} << 30);  // its form: a clear error for "12parsecs"
    REMAT_CHECK(std::find(budgets.begin(), budgets.end(), part) == budgets.end(), "the budgets list '", part, "' twice.");
    budgets.push_back(part);
  }
  return budgets;
}

PlanChoice feasible_optimal_plan(const ModelCosts& costs, const std::string& budget_text, int64_t slots,
                                 int64_t* budget_bytes, int64_t* min_feasible_bytes) {
  const int64_t unchecked = costs.unchecked_peak_bytes();
  const int64_t bytes = parse_budget(budget_text, unchecked);
  int64_t least = -1;
  PlanChoice choice = optimal_plan(costs, bytes, slots, &least);
  REMAT_CHECK(choice.feasible, "no plan fits a budget of ", budget_text, " (", bytes, " bytes): the smallest feasible ",
              "budget is ", least, " bytes (", format_bytes(least), ", ",
              fixed(100.0 * static_cast<double>(least) / static_cast<double>(unchecked), 1), "% of the unchecked peak). Give at least that, or a smaller model or batch.");
  if (budget_bytes != nullptr) *budget_bytes = bytes;
  if (min_feasible_bytes != nullptr) *min_feasible_bytes = least;
  return choice;
}

std::vector<PlanChoice> other_plans(const ModelCosts& costs, int64_t layers, int64_t budget_bytes, int64_t slots) {
  std::vector<PlanChoice> out;
  const std::vector<std::string> policies = {"block", "every:2", "every:4", "segments:2", "segments:4", "sqrt", "ffn",
                                             "attn", "ffn+attn", "selective", "matmul-inputs"};
  for (const auto& base : policies) {
    for (const std::string suffix : {"", ",skip-ends"}) {
      const std::string name = base + suffix;
      PlanChoice choice;
      choice.name = name;
      try {
        const std::string granularity = policy_granularity(name);
        models::GptChainShape chain(layers, granularity);
        choice.plan = policy_plan(name, chain);
        choice.prediction = costs.predict(choice.plan);
        choice.feasible = choice.prediction.peak_bytes <= budget_bytes;
        out.push_back(choice);
      } catch (const c10::Error&) {
        // A policy that does not apply to this depth (segments:4 of 2 blocks) is not a candidate.
      }
    }
  }
  models::GptChainShape half_chain(layers, "half");
  for (const auto& [name, result] :
       {std::make_pair(std::string("revolve"), revolve_plan(costs.half, Plan::plain(half_chain), budget_bytes, slots)),
        std::make_pair(std::string("chen"), chen_greedy_plan(costs.half, Plan::plain(half_chain), budget_bytes))}) {
    PlanChoice choice;
    choice.name = name;
    choice.feasible = result.feasible;
    choice.plan = result.plan;
    choice.prediction = result.prediction;
    out.push_back(choice);
  }
  return out;
}

std::string format_bytes(int64_t bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / (1 << 20) << " MiB";
  return os.str();
}

}  // namespace remat::cli
