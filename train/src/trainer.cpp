#include "remat/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include <ATen/Parallel.h>
#include <torch/serialize.h>
#include <torch/utils.h>
#include <unistd.h>

#include "remat/memory/memory.h"
#include "remat/base/threads.h"
#include "remat/measure/profiler.h"
#include "remat/base/error.h"
#include "remat/internal/files.h"
#include "remat/internal/statistics.h"
#include "remat/memory/memory.h"
#include "remat/models/estimator.h"
#include "remat/models/gpt_planning.h"
#include "remat/models/gpt_policies.h"
#include "remat/train/config_json.h"
#include "remat/train/state_dir.h"

namespace remat::train {

namespace fs = std::filesystem;

namespace {

// What a resumed run must train on again: the saved state's batches continue in this corpus.
nlohmann::json corpus_json(const Corpus& corpus) {
  return {{"source", corpus.source()}, {"bytes", corpus.bytes().size()}, {"fnv1a64", fnv1a64_of(corpus.bytes())}};
}

void check_options(const TrainOptions& o) {
  o.model.validate();
  REMAT_CHECK(o.model.vocabulary() == 256, "the byte-level corpus needs ", field("GptConfig::vocabulary"), " 256, got ",
              o.model.vocabulary(), ".");
  REMAT_CHECK(o.batch >= 1, field("TrainOptions::batch"), " must be at least 1, got ", o.batch, ".");
  REMAT_CHECK(o.lr > 0 && o.lr < 10, field("TrainOptions::lr"), " must be in (0, 10), got ", o.lr, ".");
  REMAT_CHECK(o.warmup_steps >= 0, field("TrainOptions::warmup_steps"), " must be >= 0, got ", o.warmup_steps, ".");
  REMAT_CHECK(o.steps >= 0, field("TrainOptions::steps"), " must be >= 0, got ", o.steps, ".");
  REMAT_CHECK(o.threads >= 1, field("TrainOptions::threads"), " must be at least 1, got ", o.threads, ".");
  REMAT_CHECK(o.plan.options().profile().repeats() >= 1, field("ProfileOptions::repeats"), " must be at least 1, got ",
              o.plan.options().profile().repeats(), ".");
  REMAT_CHECK(o.save_every >= 0, field("TrainOptions::save_every"), " must be >= 0 (0: no periodic saves), got ",
              o.save_every, ".");
  REMAT_CHECK(o.save_every == 0 || !o.save_dir.empty(), field("TrainOptions::save_every"), " needs ",
              field("TrainOptions::save_dir"), ": say where the periodic saves go.");
  REMAT_CHECK(o.keep_last >= 1, field("TrainOptions::keep_last"), " must be at least 1, got ", o.keep_last, ".");
  REMAT_CHECK(o.micro_batch >= 0 && (o.micro_batch == 0 || o.batch % o.micro_batch == 0),
              field("TrainOptions::micro_batch"), " must divide ", field("TrainOptions::batch"), " (", o.batch,
              ") so that its micro-batches are equal, got ", o.micro_batch, "; 0 runs the whole batch at once.");
  REMAT_CHECK(!o.maximize_throughput || o.plan.kind() == PlanRequest::Kind::budget,
              field("TrainOptions::maximize_throughput"), " needs a budget (", field("PlanRequest::of_budget"),
              "): the micro-batch is chosen for the most throughput under it.");
  REMAT_CHECK(!o.maximize_throughput || o.micro_batch == 0, "give ", field("TrainOptions::micro_batch"), " or ",
              field("TrainOptions::maximize_throughput"), " (which chooses it), not both.");
  for (const int64_t length : o.lengths) {
    REMAT_CHECK(length >= 1 && length <= o.model.sequence(), field("TrainOptions::lengths"), ": a length of ", length,
                " lies outside [1, ", field("GptConfig::sequence"), " = ", o.model.sequence(),
                "]; raise the model's sequence to the longest length trained.");
  }
  REMAT_CHECK(o.lengths.size() <= 4096, field("TrainOptions::lengths"), ": ", o.lengths.size(),
              " lengths; give at most 4096.");
  REMAT_CHECK(o.lengths.empty() || !o.maximize_throughput, field("TrainOptions::lengths"), " and ",
              field("TrainOptions::maximize_throughput"), " together are not supported yet: the micro-batch would be ",
              "chosen per length. Give a fixed ", field("TrainOptions::micro_batch"), " instead.");
  REMAT_CHECK(o.lengths.empty() || !o.process_group || o.plan.kind() != PlanRequest::Kind::budget,
              field("TrainOptions::lengths"), " with a budget is not supported with data-parallel training yet (the ",
              "ranks would have to agree on a plan per length); give a policy or a plan file instead.");
  if (o.plan_over_graph) {
    REMAT_CHECK(o.plan.kind() == PlanRequest::Kind::budget, field("TrainOptions::plan_over_graph"),
                " plans for a budget: give one (", field("PlanRequest::of_budget"), "), or leave it false.");
    REMAT_CHECK(o.micro_batch == 0 && !o.maximize_throughput && o.lengths.empty() && !o.process_group,
                field("TrainOptions::plan_over_graph"), " is not supported with ", field("TrainOptions::micro_batch"),
                ", ", field("TrainOptions::maximize_throughput"), ", ", field("TrainOptions::lengths"),
                " or a process group yet (one recorded step is planned); leave those at their defaults, or plan ",
                "the chain.");
  }
  REMAT_CHECK(!o.process_group || (!o.maximize_throughput && (o.micro_batch == 0 || o.micro_batch == o.batch)),
              field("TrainOptions::micro_batch"), " smaller than the batch is not supported with data-parallel ",
              "training yet (each micro-batch's backward would synchronise the gradients); lower ",
              field("TrainOptions::batch"), " per rank instead.");
}

// Refuses configurations that cannot fit in this machine's memory before allocating anything,
// rather than letting the allocator fail somewhere inside LibTorch: the plan's activation peak
// predicted from the analytic estimator, with the model, its gradients and AdamW's two moments.
void check_fits_in_memory(const TrainOptions& o, const PlanRequest& request) {
  const models::GptCosts estimated{
      models::estimate_gpt(o.model, models::EstimateOptions::as_run_by_libtorch(o.batch)).costs};
  const int64_t unchecked = estimated.unchecked_peak_bytes();
  // A plan for a budget keeps at most the budget, and never more than the unchecked plan; any other
  // plan is costed (a plan made for another chain is refused first, as its own error).
  const double activations =
      request.kind() == PlanRequest::Kind::budget
          ? static_cast<double>(std::min(unchecked, request.budget().to_bytes(unchecked)))
          : static_cast<double>(
                estimated.predict(make_plan(request, models::gpt_plan_subject(o.model.layers())).plan).peak_bytes);
  models::check_gpt_run_fits_in_memory(o.model, activations, /*optimizer_moments=*/2);  // AdamW
}

// The saved state must be of this run: the same model, batch and corpus.
void check_resumable(const std::pair<fs::path, nlohmann::json>& resumed, const TrainOptions& options,
                     const Corpus& corpus) {
  const auto& meta = resumed.second;
  REMAT_CHECK(meta.contains("config") && meta.contains("step") && meta.contains("sampler"),
              field("TrainOptions::resume_dir"), ": '", resumed.first.string(),
              "/meta.json' lacks config, step or sampler state; the state is corrupt.");
  const auto saved = meta["config"];
  const auto wanted = gpt_config_json(options.model);
  for (const auto& [key, value] : wanted.items()) {
    REMAT_CHECK(saved.contains(key) && saved[key] == value, field("TrainOptions::resume_dir"), ": the state in '",
                options.resume_dir, "' was saved for a model with ", key, " ",
                saved.value(key, nlohmann::json()).dump(), " but this run asks for ", value.dump(),
                ". Use the same GptConfig as the saved run.");
  }
  REMAT_CHECK(meta.value("batch", int64_t{0}) == options.batch, field("TrainOptions::resume_dir"),
              ": the saved run used ", field("TrainOptions::batch"), " ", meta.value("batch", int64_t{0}),
              ", this run asks for ", options.batch, ".");
  const nlohmann::json lengths = meta.value("lengths", nlohmann::json::array());
  REMAT_CHECK(lengths == nlohmann::json(options.lengths), field("TrainOptions::resume_dir"),
              ": the saved run drew its sequence lengths from ", lengths.dump(), ", this run from ",
              nlohmann::json(options.lengths).dump(), " (the batches continue where they stopped). Give the same ",
              field("TrainOptions::lengths"), ".");
  const nlohmann::json data = corpus_json(corpus);
  REMAT_CHECK(
      meta.contains("data") && meta["data"] == data, field("TrainOptions::resume_dir"), ": the saved run trained on ",
      meta.contains("data") ? meta["data"].dump() : std::string("(unrecorded data)"), ", this run on ", data.dump(),
      ". Resume with the same ", field("TrainOptions::data_file"), " (the batches continue where they stopped).");
}

// Ranks that would train different things are stopped here, before any work: the model, the
// batch, the data, the schedule and how the plan is chosen must agree.
void check_ranks_agree(const TrainOptions& o, const Corpus& corpus) {
  o.process_group->check_same(
      "the training run",
      {"model " + o.model.describe(), "batch per rank " + std::to_string(o.batch),
       "data " + corpus.source() + ", " + std::to_string(corpus.bytes().size()) + " bytes",
       "seed " + std::to_string(o.seed), "steps " + std::to_string(o.steps),
       "lr " + std::to_string(o.lr) + ", warm-up " + std::to_string(o.warmup_steps),
       "plan from " + (o.plan.kind() == PlanRequest::Kind::plan ? std::string("a plan file") : o.plan.describe()),
       "resume " + std::string(o.resume_dir.empty() ? "no" : "yes")});
}

// The saved state to resume from, checked against this run; empty when the run starts afresh.
std::pair<fs::path, nlohmann::json> load_resumed_state(const TrainOptions& o, const Corpus& corpus) {
  std::pair<fs::path, nlohmann::json> resumed;
  if (!o.resume_dir.empty()) {
    resumed = load_state_dir(o.resume_dir);
    // The files loaded below, each checked by load_state_dir only where meta.json lists it.
    for (const char* file : {"model.pt", "optimizer.pt", "rng.pt"}) {
      REMAT_CHECK(resumed.second["files"].contains(file), field("TrainOptions::resume_dir"), ": the state in '",
                  resumed.first.string(), "' lists no ", file,
                  "; it was not saved by remat train. Resume from another copy.");
    }
    check_resumable(resumed, o, corpus);
  }
  return resumed;
}

void load_model_optimizer_and_rng(const fs::path& state, models::Gpt& model, torch::optim::AdamW& optimizer) {
  try {
    torch::load(model, (state / "model.pt").string());
    torch::load(optimizer, (state / "optimizer.pt").string());
    at::Tensor rng;
    torch::load(rng, (state / "rng.pt").string());
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(rng);
  } catch (const c10::Error& e) {
    REMAT_CHECK(false, field("TrainOptions::resume_dir"), ": cannot load the state in '", state.string(),
                "': ", e.what_without_backtrace());
  }
}

}  // namespace

Trainer::Trainer(TrainOptions options) : options_(std::move(options)) {
  check_options(options_);
  threads_description_ = set_cpu_threads(options_.threads).to_string();
  install_cpu_memory_tracker();

  // Everything that can be wrong with the input is checked before any state is touched.
  corpus_ = std::make_unique<Corpus>(options_.data_file.empty() ? Corpus::from_fortunes(options_.corpus_dir)
                                                                : Corpus::from_file(options_.data_file));
  if (options_.process_group) {
    rank_ = options_.process_group->rank();
    world_size_ = options_.process_group->world_size();
    check_ranks_agree(options_, *corpus_);
  }
  const PlanRequest& request = options_.plan;
  const models::GptGranularity granularity = models::gpt_request_granularity(request);
  check_fits_in_memory(options_, request);
  const std::pair<fs::path, nlohmann::json> resumed = load_resumed_state(options_, *corpus_);
  if (!options_.save_dir.empty() && rank_ == 0) check_state_dir_writable(options_.save_dir);  // before any step

  torch::manual_seed(options_.seed);
  model_ = models::Gpt(options_.model);
  model_->train();
  chain_ = std::make_unique<models::GptChain>(model_, granularity);
  main_length_ = options_.lengths.empty() ? options_.model.sequence()
                                          : *std::max_element(options_.lengths.begin(), options_.lengths.end());
  set_up_plan(request);
  optimizer_ = std::make_unique<torch::optim::AdamW>(
      model_->parameters(), torch::optim::AdamWOptions(options_.lr).weight_decay(options_.weight_decay));
  // The global batch: the same sequences at every step whatever the number of ranks.
  sampler_ = std::make_unique<BatchSampler>(*corpus_, options_.batch * world_size_, options_.model.sequence(),
                                            options_.seed, options_.lengths);

  if (!options_.resume_dir.empty()) {
    const auto& [state, meta] = resumed;
    load_model_optimizer_and_rng(state, model_, *optimizer_);
    sampler_->set_state(meta["sampler"].get<std::string>());
    step_ = meta["step"].get<int64_t>();
  }
  if (options_.process_group) {
    synchronizer_ = std::make_unique<distributed::GradientSynchronizer>(options_.process_group, model_->parameters(),
                                                                        options_.synchronizer);
    synchronizer_->broadcast_parameters(model_->buffers());
    // Each rank its own dropout stream (rank 0's too differs from a single process's), continued
    // from the step a resumed run starts at.
    if (world_size_ > 1) torch::manual_seed(options_.seed * 1000003 + static_cast<uint64_t>(step_) * 7919 + rank_ + 1);
  }
}

void Trainer::set_up_plan(const PlanRequest& request) {
  const bool budget = request.kind() == PlanRequest::Kind::budget;
  micro_batch_ = options_.micro_batch > 0 ? options_.micro_batch : options_.batch;
  if (budget && options_.plan_over_graph) {
    // The chain runs plainly; the planned step keeps or drops what its operations save. Recorded
    // and planned on the run's first batch (a sampler of its own), the model and the RNG left as
    // they were, so that the first training step already runs under the plan.
    plan_ = Plan::unchecked(*chain_);
    BatchSampler first(*corpus_, options_.batch, options_.model.sequence(), options_.seed);
    const auto [tokens, targets] = first.next();
    std::vector<at::Tensor> state = model_->parameters();
    for (const auto& b : model_->buffers()) state.push_back(b);
    const PlanResult planned = make_plan(request, PlanSubject::of_step(
                                                      [&, tokens = tokens, targets = targets] {
                                                        chain_->set_targets(targets);
                                                        return run_plan(*chain_, plan_, tokens);
                                                      },
                                                      std::move(state)));
    plan_source_ = planned.source;
    graph_step_ = planned.step;
    budget_plan_ = planned;
  } else if (budget && rank_ != 0) {
    // Rank 0 profiles and plans; every rank runs its plan, so that their gradients are ready in the
    // same order (timing noise could otherwise give each rank a plan of its own).
    plan_ = Plan::from_json(options_.process_group->share("the plan", ""), "rank 0's plan");
    plan_source_ = "optimal for budget " + request.name() + " per rank (planned by rank 0)";
  } else if (budget && !options_.lengths.empty()) {
    profile_lengths(request);
    BatchSampler longest(*corpus_, options_.batch, main_length_, options_.seed);
    const auto [tokens, targets] = longest.next();
    const LengthPlan& planned = plan_for_length(main_length_, tokens, targets, nullptr);
    plan_ = planned.result.plan;
    plan_source_ = planned.result.source + "; a plan per sequence length";
    budget_plan_ = planned.result;
  } else {
    // Profiled and verified on the run's first batch (a sampler of its own: the run's batches are
    // unchanged), at the micro-batch size; both leave the model, its gradients and the RNG as they were.
    BatchSampler first(*corpus_, options_.batch, options_.model.sequence(), options_.seed);
    const auto [tokens, targets] = first.next();
    PlanRequest micro_request = request;
    std::optional<CostTable> micro_costs;
    if (budget && options_.maximize_throughput) {
      const PlanningOptions& planning = request.options();
      const ProfiledBatches profiled = models::profile_gpt_batches(
          model_, tokens, targets, default_profile_batches(options_.batch), planning.profile(), planning.mode());
      const ThroughputChoice& choice = throughput_.emplace(plan_throughput(
          profiled.costs_at(), options_.batch, request.budget(), ThroughputOptions().planner(planning.planner())));
      micro_batch_ = choice.chosen().micro_batch;
      // The whole batch's budget in bytes, for the micro-batch's plan, planned on the throughput
      // search's table at that size and verified on the micro-batch.
      micro_request = PlanRequest::of_budget(Budget::bytes(choice.budget_bytes)).options(planning);
      micro_costs = profiled.at(micro_batch_);
    }
    PlanSubject subject =
        models::gpt_plan_subject(model_, tokens.narrow(0, 0, micro_batch_), targets.narrow(0, 0, micro_batch_));
    if (micro_costs) subject.costs(std::move(*micro_costs));
    const PlanResult chosen = make_plan(micro_request, subject);
    plan_ = chosen.plan;
    plan_source_ = chosen.source;
    if (throughput_) {
      plan_source_ = "most throughput under budget " + request.name() + ": micro-batch " +
                     std::to_string(micro_batch_) + " x " + std::to_string(options_.batch / micro_batch_) + ", " +
                     chosen.source;
    }
    if (budget) budget_plan_ = chosen;
    if (budget && world_size_ > 1) options_.process_group->share("the plan", plan_.to_json());
  }
  plan_.bind_to(*chain_);
  if (world_size_ > 1) options_.process_group->check_same("the plan", {plan_.to_string()});
}

void Trainer::profile_lengths(const PlanRequest& request) {
  // Each on a batch of its own length (a sampler of its own: the run's batches are unchanged).
  const std::vector<int64_t> profiled = ShapeTerms::lengths_to_profile(options_.lengths);
  const PlanningOptions& planning = request.options();
  std::vector<ShapedCosts> samples;
  for (const int64_t length : profiled) {
    BatchSampler sampler(*corpus_, options_.batch, length, options_.seed);
    const auto [tokens, targets] = sampler.next();
    const PlanSubject subject =
        models::gpt_plan_subject(model_, tokens.narrow(0, 0, micro_batch_), targets.narrow(0, 0, micro_batch_));
    CostTable costs = profile_chain(*subject.chain(), subject.sample_input(), planning.profile(), planning.mode());
    samples.push_back(ShapedCosts{{length}, costs});
    profiled_lengths_.emplace(length, std::move(costs));
  }
  if (samples.size() >= 3) length_costs_ = ShapeCosts::fit(samples, ShapeTerms::length_only());
}

const LengthPlan& Trainer::plan_for_length(int64_t length, const at::Tensor& tokens, const at::Tensor& targets,
                                           double* planning_seconds) {
  if (const auto found = length_plans_.find(length); found != length_plans_.end()) return found->second;
  const auto start = std::chrono::steady_clock::now();
  const auto profiled = profiled_lengths_.find(length);
  const bool from_fit = profiled == profiled_lengths_.end();
  REMAT_CHECK(!from_fit || length_costs_, "no costs for sequence length ", length,
              ": it is not one of TrainOptions::lengths.");  // lengths are checked when the sampler is made
  // Verified by one measured step of this length; on fitted costs no measured choice among the rules of
  // thumb (the fit's times are least squares). Model, gradients and RNG are left as they were.
  PlanRequest request = options_.plan;
  if (from_fit) request.options().choice().when(ChooseByMeasurement::never);
  PlanSubject subject =
      models::gpt_plan_subject(model_, tokens.narrow(0, 0, micro_batch_), targets.narrow(0, 0, micro_batch_));
  subject.costs(from_fit ? length_costs_->at({length}) : profiled->second);
  LengthPlan made;
  made.result = make_plan(request, subject);
  made.result.plan.bind_to(*chain_);
  made.from_fit = from_fit;
  made.planning_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (planning_seconds != nullptr) *planning_seconds = made.planning_seconds;
  return length_plans_.emplace(length, std::move(made)).first->second;
}

std::pair<at::Tensor, at::Tensor> Trainer::local_batch(std::pair<at::Tensor, at::Tensor> global) const {
  if (world_size_ == 1) return global;
  return {global.first.narrow(0, rank_ * options_.batch, options_.batch),
          global.second.narrow(0, rank_ * options_.batch, options_.batch)};
}

StepRecord Trainer::step() {
  auto [tokens, targets] = local_batch(sampler_->next());
  ++step_;
  StepRecord record;
  record.sequence = tokens.size(1);
  // With lengths and a budget, this length's plan (made now on its first step, before the step's clock).
  const Plan* plan = &plan_;
  if (!profiled_lengths_.empty()) {  // lengths under a budget
    const LengthPlan& planned = plan_for_length(record.sequence, tokens, targets, &record.planning_seconds);
    plan = &planned.result.plan;
    record.budget_bytes = planned.result.budget_bytes;
    record.predicted_peak_bytes = planned.result.prediction.peak_bytes;
  }
  const double warmup = static_cast<double>(std::max<int64_t>(options_.warmup_steps, 1));
  const double lr = options_.lr * std::min(1.0, static_cast<double>(step_) / warmup);
  for (auto& group : optimizer_->param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);

  const auto start = std::chrono::steady_clock::now();
  // Gradients zeroed in place, on every LibTorch: from 2.0 Optimizer::zero_grad() frees them, and
  // each backward would allocate them again inside the step's activation peak (and its budget).
  for (auto& p : model_->parameters()) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
  // Micro-batches in order, their gradients accumulated: each loss (a mean over its tokens) scaled
  // by 1/k makes the sum the whole batch's mean-loss gradient.
  const int64_t micro_batches = tokens.size(0) / micro_batch_;
  double loss_sum = 0;
  int64_t activation_peak = 0;
  for (int64_t i = 0; i < micro_batches; ++i) {
    const bool whole = micro_batches == 1;
    const at::Tensor micro_tokens = whole ? tokens : tokens.narrow(0, i * micro_batch_, micro_batch_);
    chain_->set_targets(whole ? targets : targets.narrow(0, i * micro_batch_, micro_batch_));
    at::Tensor micro_loss;
    const StepMeasurement m = measure_step([&] {
      if (graph_step_) {
        micro_loss = graph_step_->run([&] { return run_plan(*chain_, *plan, micro_tokens); });
        return micro_loss;  // one micro-batch: plan_over_graph refuses more
      }
      micro_loss = run_plan(*chain_, *plan, micro_tokens);
      return whole ? micro_loss : micro_loss / static_cast<double>(micro_batches);
    });
    loss_sum += micro_loss.item<double>();
    activation_peak = std::max(activation_peak, m.activation_peak_bytes());
  }
  const double loss = loss_sum / static_cast<double>(micro_batches);
  if (graph_step_ && graph_step_->planned() && !graph_step_->last_run_recorded()) {
    record.budget_bytes = graph_step_->plan().budget_bytes;
    record.predicted_peak_bytes = graph_step_->plan().predicted_peak_bytes;
  }
  if (synchronizer_) record.communication_seconds = synchronizer_->finish().wait_seconds;
  optimizer_->step();
  record.step = step_;
  // The global batch's loss: the mean of the ranks' (equal-sized slices).
  record.loss = options_.process_group ? options_.process_group->mean(loss) : loss;
  record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  record.activation_peak_bytes = activation_peak;
  record.tokens = tokens.numel() * world_size_;
  if (options_.save_every > 0 && step_ % options_.save_every == 0) save();
  return record;
}

void Trainer::save() const {
  REMAT_CHECK(!options_.save_dir.empty(), "save: ", field("TrainOptions::save_dir"), " is empty; say where to save.");
  if (saved_step_ == step_) return;
  save(options_.save_dir);
}

void Trainer::save(const std::string& dir) const {
  if (rank_ != 0) {  // every rank holds the same state; rank 0 alone writes it
    if (dir == options_.save_dir) saved_step_ = step_;
    return;
  }
  nlohmann::json meta = {{"format", "remat-train-state"},
                         {"version", 1},
                         {"step", step_},
                         {"config", gpt_config_json(options_.model)},
                         {"batch", options_.batch},
                         {"lengths", options_.lengths},
                         {"sampler", sampler_->state()},
                         {"plan", plan_.to_string()},
                         {"data", corpus_json(*corpus_)}};
  save_state_dir(
      dir, step_, meta,
      [&](const fs::path& into) {
        torch::save(model_, (into / "model.pt").string());
        torch::save(*optimizer_, (into / "optimizer.pt").string());
        torch::save(at::detail::getDefaultCPUGenerator().get_state(), (into / "rng.pt").string());
      },
      options_.keep_last);
  if (dir == options_.save_dir) saved_step_ = step_;
}

PlanVerification Trainer::verify() {
  BatchSampler first(*corpus_, options_.batch, main_length_, options_.seed);  // the run's batches unchanged
  auto [tokens, targets] = first.next();
  chain_->set_targets(targets.narrow(0, 0, micro_batch_));
  return verify_plan(*chain_, plan_, tokens.narrow(0, 0, micro_batch_));
}

CompareResult Trainer::compare(int steps) {
  // With lengths, a batch of the length plan() is for, from a sampler of its own.
  BatchSampler main_length(*corpus_, options_.batch * world_size_, main_length_, options_.seed + 1);
  auto [batch_tokens, batch_targets] = local_batch(options_.lengths.empty() ? sampler_->next() : main_length.next());
  // One micro-batch: what the plan was made for and each forward holds.
  const at::Tensor tokens = batch_tokens.narrow(0, 0, micro_batch_), targets = batch_targets.narrow(0, 0, micro_batch_);
  const auto measured = models::gpt_measure_plans(model_, {plan_, Plan::unchecked(*chain_)}, tokens, targets, steps);
  optimizer_->zero_grad();
  CompareResult result;
  result.plan_activation_peak_bytes = measured[0].activation_peak_bytes;
  result.plan_step_seconds = measured[0].step_seconds;
  result.none_activation_peak_bytes = measured[1].activation_peak_bytes;
  result.none_step_seconds = measured[1].step_seconds;
  result.step_time_ratio = paired_time_ratio(measured[0], measured[1]);
  return result;
}

std::string Trainer::sample(const std::string& prompt, int64_t length, uint64_t seed) {
  REMAT_CHECK(!prompt.empty(), "sample: the prompt must not be empty.");
  torch::NoGradGuard no_grad;
  model_->eval();
  at::Generator generator = at::detail::createCPUGenerator(seed);
  std::string text = prompt;
  for (int64_t i = 0; i < length; ++i) {
    const int64_t T = std::min<int64_t>(static_cast<int64_t>(text.size()), options_.model.sequence());
    at::Tensor tokens = torch::empty({1, T}, torch::kLong);
    for (int64_t t = 0; t < T; ++t) tokens[0][t] = static_cast<unsigned char>(text[text.size() - T + t]);
    at::Tensor x = model_->embed(tokens);
    for (auto& block : model_->blocks) x = block->mlp_half(block->attention_half(x));
    at::Tensor probs = (model_->logits(x)[0][T - 1] / 0.8).softmax(-1);
    text += static_cast<char>(at::multinomial(probs, 1, false, generator).item<int64_t>());
  }
  model_->train();
  return text;
}

}  // namespace remat::train
