// Training the GPT on a text corpus under a checkpointing plan, one measured step at a time.
//
//   remat::train::TrainOptions options;       // model, optimiser, data
//   options.plan = remat::PlanRequest::of_budget("50%");  // or of_policy("block"), of_plan_file(path)
//   remat::train::Trainer trainer(options);   // builds (or resumes) everything, validating input
//   for (int i = 0; i < options.steps; ++i) trainer.step();
//   trainer.save("run1");                     // atomic: a crash keeps the previous state
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/optim/adamw.h>

#include "remat/base/threads.h"
#include "remat/autoplan/make_plan.h"
#include "remat/planning/planner.h"
#include "remat/models/gpt.h"
#include "remat/models/gpt_planning.h"
#include "remat/chain/plan.h"
#include "remat/distributed/data_parallel.h"
#include "remat/graph/planned_step.h"
#include "remat/measure/plan_measurement.h"
#include "remat/planning/shape_costs.h"
#include "remat/planning/throughput.h"
#include "remat/train/corpus.h"

namespace remat::train {

struct TrainOptions {
  models::GptConfig model;
  int64_t batch = 8;
  double lr = 1e-3;           ///< peak learning rate, reached after `warmup_steps`
  int64_t warmup_steps = 20;  ///< linear warm-up from lr/warmup to lr
  double weight_decay = 0.01;
  int64_t steps = 100;  ///< steps this run performs (a resumed run continues its count)
  /// The plan the run trains under: a GPT policy (models/gpt_policies.h), a saved plan
  /// (PlanRequest::of_plan_file) or the optimal plan for an activation budget, made by make_plan on
  /// the run's first batch (profiled, verified, timed against the nearest rules of thumb); with its
  /// checkpoint mode and how it is made (PlanRequest::options).
  PlanRequest plan = PlanRequest::of_policy("none");
  /// Sequences per forward and backward: each step's `batch` runs as batch / micro_batch
  /// micro-batches whose gradients add up (each loss scaled by micro_batch / batch) to the
  /// batch's own. 0: the whole batch at once. A divisor of `batch`; plans are made for it.
  int64_t micro_batch = 0;
  /// With a budget: choose micro_batch together with the plan, for the most samples per second
  /// under the budget (remat/planning/throughput.h; a share of the budget is of the whole batch's peak).
  bool maximize_throughput = false;
  /// Sequence lengths each step draws from, uniformly (bucketed lengths: windows of that many bytes
  /// of the running text, never padded), each at most model.sequence(); empty: model.sequence() every
  /// step. With a budget, each length runs under a plan of its own: the costs are profiled at three
  /// of them (the least, the middle and the greatest), fitted in the length (ShapeTerms::length_only)
  /// and a length is planned on its first step from the fit, verified by one measured step of it.
  std::vector<int64_t> lengths;
  /// With a budget: plan the whole training step over its graph (remat::PlannedStep,
  /// remat/graph/planned_step.h) instead of the GPT's chain of half-blocks: the step is recorded
  /// once on the run's first batch (make_plan with PlanSubject::of_step: the model and the
  /// RNG left as they were), then every step keeps or drops each tensor autograd saves and replays
  /// the recorded calls that rebuild the dropped ones. A share of the budget is of the recorded
  /// step's peak. Not with micro_batch, maximize_throughput, lengths or a process group.
  bool plan_over_graph = false;
  int threads = std::min(2, usable_cpus());  ///< 2, or 1 where the process may use one CPU only
  uint64_t seed = 0;
  std::string data_file;                       ///< empty: the default corpus
  std::string corpus_dir = kDefaultCorpusDir;  ///< where the default corpus lives
  std::string resume_dir;                      ///< continue from this saved state
  std::string save_dir;                        ///< where save() and periodic saves write (remat/train/state_dir.h)
  int64_t save_every = 0;                      ///< > 0: step() saves to save_dir after every this many global steps
  int keep_last = 1;                           ///< saved states kept in save_dir, the newest; older ones are removed
  /// Data-parallel training: this process is one rank of the group. `batch` is then per rank: step
  /// t's global batch (batch x ranks sequences) is the same whatever the number of ranks, and rank r
  /// trains on its r-th slice; gradients are averaged (remat/distributed/data_parallel.h); rank 0 alone saves.
  std::shared_ptr<distributed::ProcessGroup> process_group;
  distributed::SynchronizerOptions synchronizer;
};

struct StepRecord {
  int64_t step = 0;  ///< global step number, from 1
  double loss = 0;
  double seconds = 0;  ///< forward + backward + optimiser update
  int64_t activation_peak_bytes = 0;
  int64_t tokens = 0;                ///< over all ranks
  double communication_seconds = 0;  ///< waiting for gradients from the other ranks after backward
  int64_t sequence = 0;              ///< this step's sequence length
  /// With TrainOptions::lengths and a budget: the budget of this length's plan in bytes, the peak its
  /// costs predicted (fitted, or profiled at this length), and the seconds spent planning it on this
  /// step (0 after its first).
  int64_t budget_bytes = -1, predicted_peak_bytes = -1;
  double planning_seconds = 0;
};

/// A plan made for one sequence length (TrainOptions::lengths with a budget).
struct LengthPlan {
  PlanResult result;
  double planning_seconds = 0;
  bool from_fit = false;  ///< planned on fitted costs; else on costs profiled at this length
};

struct CompareResult {
  int64_t plan_activation_peak_bytes = 0, none_activation_peak_bytes = 0;
  double plan_step_seconds = 0, none_step_seconds = 0;  ///< medians, interleaved steps
  double step_time_ratio = 0;                           ///< plan / none, paired per round (remat::paired_time_ratio)
};

class Trainer {
 public:
  explicit Trainer(TrainOptions options);

  /// One training step; then, every TrainOptions::save_every global steps, a save to save_dir.
  StepRecord step();
  /// Saves model, optimiser, step, config, plan and RNG states to `dir` atomically, keeping the
  /// newest TrainOptions::keep_last states there.
  void save(const std::string& dir) const;
  /// save(TrainOptions::save_dir), unless this step is already saved there.
  void save() const;
  /// Measures `steps` interleaved forward+backward passes of the plan and of `none` on one batch,
  /// without updating the model.
  CompareResult compare(int steps);
  /// Generates `length` bytes after `prompt` by sampling (own generator: training RNG untouched).
  std::string sample(const std::string& prompt, int64_t length, uint64_t seed);

  const Plan& plan() const { return plan_; }
  /// The planner's result when the plan was made for a budget (TrainOptions::plan).
  const std::optional<PlanResult>& budget_plan() const { return budget_plan_; }
  /// TrainOptions::plan_over_graph: the step planned over its graph (make_plan's PlanResult::step,
  /// recorded and planned on the run's first batch before the first step).
  const PlannedStep* graph_step() const { return graph_step_.get(); }
  /// One step plain and one under the plan on the run's first batch (remat::verify_plan); no
  /// update, and the model, its gradients and the RNG are left as they were.
  PlanVerification verify();
  const std::string& plan_source() const { return plan_source_; }
  /// TrainOptions::lengths with a budget: the plan of each length planned so far, and the fit of the
  /// costs in the length they were planned from.
  const std::map<int64_t, LengthPlan>& length_plans() const { return length_plans_; }
  const std::optional<ShapeCosts>& length_costs() const { return length_costs_; }
  /// Sequences per forward and backward (TrainOptions::micro_batch, or the throughput search's choice).
  int64_t micro_batch() const { return micro_batch_; }
  /// The throughput search's frontier, when TrainOptions::maximize_throughput chose the micro-batch.
  const std::optional<ThroughputChoice>& throughput_choice() const { return throughput_; }
  models::Gpt model() const { return model_; }
  int64_t global_step() const { return step_; }
  const TrainOptions& options() const { return options_; }
  const Corpus& corpus() const { return *corpus_; }
  const std::string& threads_description() const { return threads_description_; }
  /// Data-parallel runs: the gradient buckets, and the bytes of their flat buffers.
  int synchronizer_buckets() const { return synchronizer_ ? synchronizer_->buckets() : 0; }
  int64_t synchronizer_bytes() const { return synchronizer_ ? synchronizer_->bucket_bytes_allocated() : 0; }

 private:
  TrainOptions options_;
  std::unique_ptr<Corpus> corpus_;
  std::unique_ptr<BatchSampler> sampler_;
  models::Gpt model_{nullptr};
  std::unique_ptr<models::GptChain> chain_;
  Plan plan_;
  std::string plan_source_;
  std::optional<PlanResult> budget_plan_;
  std::shared_ptr<PlannedStep> graph_step_;
  std::map<int64_t, LengthPlan> length_plans_;
  std::map<int64_t, CostTable> profiled_lengths_;
  std::optional<ShapeCosts> length_costs_;
  /// The longest of TrainOptions::lengths, or model.sequence() without them: what verify() and
  /// compare() measure, and the length plan() is for.
  int64_t main_length_ = 0;
  /// Profiles three lengths and fits their costs (TrainOptions::lengths with a budget).
  void profile_lengths(const PlanRequest& request);
  /// The plan of `length`, made on its first step (tokens and targets: that step's batch).
  const LengthPlan& plan_for_length(int64_t length, const at::Tensor& tokens, const at::Tensor& targets,
                                    double* planning_seconds);
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  int64_t step_ = 0;
  mutable int64_t saved_step_ = -1;
  int rank_ = 0, world_size_ = 1;
  std::unique_ptr<distributed::GradientSynchronizer> synchronizer_;
  /// Sets plan_ and plan_source_ from the request and binds the plan; for a budget rank 0 profiles,
  /// plans and verifies the plan on the run's first batch, and the other ranks receive its plan.
  void set_up_plan(const PlanRequest& request);
  int64_t micro_batch_ = 0;
  std::optional<ThroughputChoice> throughput_;
  /// This rank's slice of a global batch.
  std::pair<at::Tensor, at::Tensor> local_batch(
      std::pair<at::Tensor, at::Tensor> global) const;  ///< the global step last saved to save_dir
  std::string threads_description_;
};

}  // namespace remat::train
