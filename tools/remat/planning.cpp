#include "planning.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "remat/planning/budget.h"
#include "remat/memory/memory.h"
#include "remat/base/threads.h"
#include "remat/base/error.h"
#include "remat/internal/files.h"
#include "remat/models/estimator.h"
#include "remat/train/corpus.h"

namespace remat::cli {

SampleModel make_sample_model(const train::TrainOptions& options) {
  // Its unchecked step is what profiling and measuring run: refused before allocating if too big.
  const models::GptCosts estimated{
      models::estimate_gpt(options.model, models::EstimateOptions::as_run_by_libtorch(options.batch)).costs};
  models::check_gpt_run_fits_in_memory(options.model, static_cast<double>(estimated.unchecked_peak_bytes()), 0);
  set_cpu_threads(options.threads);
  const train::Corpus corpus = options.data_file.empty() ? train::Corpus::from_fortunes(options.corpus_dir)
                                                         : train::Corpus::from_file(options.data_file);
  train::BatchSampler sampler(corpus, options.batch, options.model.sequence(), options.seed);
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

ModelCosts profile_model(const train::TrainOptions& options, int repeats, CheckpointMode mode) {
  const SampleModel sample = make_sample_model(options);
  return models::profile_gpt(sample.model, sample.tokens, sample.targets, PlanningOptions().profile().repeats(repeats),
                             mode);
}

void save_profile(const ModelCosts& costs, const std::string& path) {
  write_file_atomically(path, costs.half.to_json() + "\n");
}

ModelCosts load_profile_for(const std::string& path, const train::TrainOptions& options) {
  const std::string text = read_regular_file(path, "--profile");
  ModelCosts costs = models::gpt_costs_from_json(text, path);
  models::check_gpt_costs(costs, options.model, options.batch, path);
  return costs;
}

std::vector<std::string> budget_list(const std::vector<std::string>& given) {
  std::vector<std::string> budgets;
  for (const auto& part : given) {
    if (part.empty()) continue;
    Budget::parse(part);  // its form: a clear error for "12parsecs"
    REMAT_CHECK(std::find(budgets.begin(), budgets.end(), part) == budgets.end(), "--budget lists '", part, "' twice.");
    budgets.push_back(part);
  }
  return budgets;
}

}  // namespace remat::cli
