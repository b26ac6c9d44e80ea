// remat/train/trainer.h: training the GPT: every policy trains exactly like `none`, resume equals a straight run,
// and bad input (flags, data, plans, saved state) is a clear error that leaves saved state untouched.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/chain/plan.h"
#include "remat/models/gpt.h"
#include "remat/train/state_dir.h"
#include "remat/train/trainer.h"
#include "support/compare.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using remat::train::Trainer;
using remat::train::TrainOptions;

using remat::testing::error_of;
using remat::testing::read_file;
using remat::testing::TempDir;
using remat::testing::write_file;

namespace {

TrainOptions small_run(const std::string& policy = "none") {
  TrainOptions o;
  o.model.layers(4).hidden(32).heads(4).sequence(16).dropout(0.1);
  o.batch = 2;
  o.lr = 3e-3;
  o.warmup_steps = 5;
  o.plan = remat::PlanRequest::of_policy(policy);
  o.seed = 7;
  return o;
}

struct RunOutcome {
  std::vector<double> losses;
  std::vector<std::pair<std::string, at::Tensor>> parameters;
};

RunOutcome train_steps(Trainer& trainer, int steps) {
  RunOutcome out;
  for (int i = 0; i < steps; ++i) out.losses.push_back(trainer.step().loss);
  for (const auto& p : trainer.model()->named_parameters())
    out.parameters.emplace_back(p.key(), p.value().detach().clone());
  return out;
}

void expect_same_parameters(const RunOutcome& a, const RunOutcome& b) {
  ASSERT_EQ(a.parameters.size(), b.parameters.size());
  for (size_t i = 0; i < a.parameters.size(); ++i) {
    EXPECT_TRUE(remat::testing::bitwise_equal(a.parameters[i].second, b.parameters[i].second)) << a.parameters[i].first;
  }
}

}  // namespace

TEST(Train, EveryPolicyTrainsExactlyLikeNoneInBothCheckpointModes) {
  Trainer reference(small_run("none"));
  const RunOutcome none = train_steps(reference, 3);
  for (const auto mode : {remat::CheckpointMode::reentrant, remat::CheckpointMode::non_reentrant}) {
    for (const std::string policy : {"block", "every:2", "segments:2", "sqrt", "ffn", "attn", "ffn+attn", "core-attn",
                                     "block,skip-ends", "every:3,skip-ends", "attn,skip-ends"}) {
      SCOPED_TRACE("policy " + policy + ", " + remat::to_string(mode));
      TrainOptions o = small_run(policy);
      o.plan.mode(mode);
      Trainer trainer(o);
      EXPECT_EQ(trainer.plan().mode, mode);
      const RunOutcome outcome = train_steps(trainer, 3);
      EXPECT_EQ(outcome.losses, none.losses);
      expect_same_parameters(none, outcome);
    }
  }
}

TEST(Train, MatmulInputsTrainsLikeNoneWithinFloatRounding) {
  // The fused LayerNorm→Linear and GELU→Linear backward computes the same derivatives as autograd
  // with its own matmul calls on flattened views, so gradients may differ in the last bits: the
  // first loss is exact, later ones and the parameters agree to float rounding.
  Trainer reference(small_run("none"));
  const RunOutcome none = train_steps(reference, 3);
  Trainer trainer(small_run("matmul-inputs"));
  const RunOutcome outcome = train_steps(trainer, 3);
  EXPECT_EQ(outcome.losses[0], none.losses[0]);
  for (size_t i = 1; i < none.losses.size(); ++i) EXPECT_NEAR(outcome.losses[i], none.losses[i], 1e-5);
  for (size_t i = 0; i < none.parameters.size(); ++i) {
    EXPECT_TRUE(none.parameters[i].second.allclose(outcome.parameters[i].second, 1e-4, 1e-6))
        << none.parameters[i].first;
  }
}

TEST(Train, ANestedPlanFromAFileTrainsExactlyLikeNone) {
  TempDir dir;
  write_file(dir / "nested.json", R"({"format": "remat-plan", "version": 1, "granularity": "block",
    "stages": ["embed", "block0", "block1", "block2", "block3", "head"],
    "options": ["full", "full", "core-attn", "full", "full", "full"],
    "plan": [{"checkpoint": ["embed", {"checkpoint": ["block0"]}, "block1"]},
             {"checkpoint": [{"checkpoint": ["block2", "block3"]}, "head"]}]})");
  Trainer reference(small_run("none"));
  const RunOutcome none = train_steps(reference, 3);
  TrainOptions o = small_run();
  o.plan = remat::PlanRequest::of_plan_file((dir / "nested.json").string());
  Trainer trainer(o);
  EXPECT_EQ(trainer.plan().to_string(), "[embed [block0] block1:core-attn] [[block2 block3] head]");
  const RunOutcome outcome = train_steps(trainer, 3);
  EXPECT_EQ(outcome.losses, none.losses);
  expect_same_parameters(none, outcome);
}

TEST(Train, LossFallsOnTheDefaultCorpus) {
  TrainOptions o = small_run("block");
  Trainer trainer(o);
  const RunOutcome outcome = train_steps(trainer, 40);
  EXPECT_GT(outcome.losses.front(), 5.0);  // ~ln(256) = 5.55 at initialisation
  EXPECT_LT(outcome.losses.back(), outcome.losses.front() - 1.0);
}

TEST(Train, ResumeGivesTheParametersOfAStraightRun) {
  TempDir dir;
  Trainer straight(small_run("block"));
  const RunOutcome forty = train_steps(straight, 40);

  TrainOptions first_half = small_run("block");
  Trainer first(first_half);
  train_steps(first, 20);
  first.save((dir / "state").string());

  TrainOptions second_half = small_run("core-attn");  // the policy may change; the model may not
  second_half.resume_dir = (dir / "state").string();
  Trainer second(second_half);
  EXPECT_EQ(second.global_step(), 20);
  const RunOutcome resumed = train_steps(second, 20);
  EXPECT_EQ(std::vector<double>(forty.losses.begin() + 20, forty.losses.end()), resumed.losses);
  expect_same_parameters(forty, resumed);
}

TEST(Train, BadModelFlagsDataAndPlansAreClearErrors) {
  TrainOptions o = small_run();
  o.model.heads(5);
  REMAT_EXPECT_ERROR(Trainer{o}, "GptConfig::heads (5) must divide GptConfig::hidden (32)");
  REMAT_EXPECT_ERROR(Trainer{small_run("nonsense")}, "unknown policy 'nonsense'");

  TempDir dir;
  o = small_run();
  o.data_file = (dir / "missing.txt").string();
  REMAT_EXPECT_ERROR(Trainer{o}, "does not exist; TrainOptions::data_file takes a text file");
  write_file(dir / "empty.txt", "");
  o.data_file = (dir / "empty.txt").string();
  REMAT_EXPECT_ERROR(Trainer{o}, "is empty");
  write_file(dir / "short.txt", "too short");
  o.data_file = (dir / "short.txt").string();
  REMAT_EXPECT_ERROR(Trainer{o}, "fewer than one training window of GptConfig::sequence + 1 = 17 bytes");
  o = small_run();
  o.corpus_dir = (dir / "no-fortunes").string();
  REMAT_EXPECT_ERROR(Trainer{o}, "Install Debian's `fortunes` package");

  o = small_run();
  REMAT_EXPECT_ERROR(remat::PlanRequest::of_plan_file((dir / "absent.json").string()), "plan file '");
  write_file(dir / "two-layers.json", R"({"format": "remat-plan", "version": 1, "granularity": "block",
    "stages": ["embed", "block0", "block1", "head"], "options": ["full", "full", "full", "full"],
    "plan": ["embed", {"checkpoint": ["block0"]}, "block1", "head"]})");
  o.plan = remat::PlanRequest::of_plan_file((dir / "two-layers.json").string());
  REMAT_EXPECT_ERROR(Trainer{o}, "the plan was made for a chain of 4 stages");

  o = small_run();
  REMAT_EXPECT_ERROR(remat::PlanRequest::of_budget("12parsecs"), "has an unknown unit 'parsecs'");
  o.plan = remat::PlanRequest::of_budget("1KiB");
  REMAT_EXPECT_ERROR(Trainer{o}, "the smallest feasible budget is");
  o.plan = remat::PlanRequest::of_policy("every:0");
  REMAT_EXPECT_ERROR(Trainer{o}, "K must be a whole number >= 1");
  o.plan = remat::PlanRequest::of_budget("50%");
  o.plan.options().profile().repeats(0);
  REMAT_EXPECT_ERROR(Trainer{o}, "ProfileOptions::repeats must be at least 1, got 0");
}

TEST(Train, ABudgetIsPlannedForAndTrainsLikeNone) {
  TrainOptions budgeted = small_run();
  budgeted.plan = remat::PlanRequest::of_budget("50%");
  budgeted.plan.options().profile().repeats(1);
  Trainer trainer(budgeted);
  ASSERT_TRUE(trainer.budget_plan().has_value());
  EXPECT_LE(trainer.budget_plan()->prediction.peak_bytes, trainer.budget_plan()->budget_bytes);
  EXPECT_NE(trainer.plan().to_string(),
            remat::Plan::unchecked(remat::models::GptChain(trainer.model(), remat::models::GptGranularity::half))
                .to_string());
  EXPECT_NE(trainer.plan_source().find("optimal for budget 50%"), std::string::npos) << trainer.plan_source();
  const remat::PlanVerification v = trainer.verify();  // against the same stage options unchecked
  EXPECT_TRUE(v.bitwise_equal()) << v.to_string();
  // Profiling and verifying left the run as a straight one: the same losses as the plan's stage
  // options unchecked (`none` itself where it keeps every option at full; options such as fused
  // compute differently by design).
  const RunOutcome planned = train_steps(trainer, 3);
  TrainOptions same_options = small_run();
  remat::Plan unchecked = remat::Plan::unchecked(
      remat::models::GptChain(trainer.model(), remat::models::gpt_granularity_of(trainer.plan())));
  unchecked.options = trainer.plan().options;
  TempDir dir;
  const std::string unchecked_file = (dir / "unchecked.json").string();
  std::ofstream(unchecked_file) << unchecked.to_json();
  same_options.plan = remat::PlanRequest::of_plan_file(unchecked_file);
  Trainer reference(same_options);
  const RunOutcome none = train_steps(reference, 3);
  EXPECT_EQ(planned.losses, none.losses);
  expect_same_parameters(planned, none);
}

TEST(Train, AStepPlannedOverItsGraphStaysWithinTheBudgetAndTrainsExactlyLikeNone) {
  TrainOptions graph = small_run();
  graph.plan = remat::PlanRequest::of_budget("75%");
  graph.plan_over_graph = true;
  Trainer trainer(graph);
  EXPECT_NE(trainer.plan_source().find("planned over the step's graph for budget 75%"), std::string::npos);
  ASSERT_NE(trainer.graph_step(), nullptr);
  ASSERT_TRUE(trainer.graph_step()->planned());  // recorded and planned before the first step
  ASSERT_TRUE(trainer.budget_plan().has_value());
  EXPECT_EQ(trainer.budget_plan()->planner, remat::PlannerKind::graph);
  RunOutcome planned;
  for (int i = 0; i < 4; ++i) {
    const remat::train::StepRecord r = trainer.step();
    planned.losses.push_back(r.loss);
    EXPECT_FALSE(trainer.graph_step()->last_run_recorded());
    EXPECT_GT(trainer.graph_step()->plan().dropped, 0);
    EXPECT_EQ(r.budget_bytes, trainer.graph_step()->plan().budget_bytes);
    EXPECT_LE(r.activation_peak_bytes, r.budget_bytes) << "step " << r.step;
  }
  for (const auto& p : trainer.model()->named_parameters())
    planned.parameters.emplace_back(p.key(), p.value().detach().clone());
  Trainer reference(small_run());
  const RunOutcome none = train_steps(reference, 4);
  EXPECT_EQ(planned.losses, none.losses);
  expect_same_parameters(planned, none);
}

TEST(Train, PlanningOverTheGraphNeedsABudgetAndOneWholeBatch) {
  TrainOptions no_budget = small_run();
  no_budget.plan_over_graph = true;
  REMAT_EXPECT_ERROR(Trainer{no_budget}, "TrainOptions::plan_over_graph plans for a budget");
  TrainOptions micro = small_run();
  micro.plan = remat::PlanRequest::of_budget("50%");
  micro.plan_over_graph = true;
  micro.micro_batch = 1;
  REMAT_EXPECT_ERROR(Trainer{micro}, "is not supported with TrainOptions::micro_batch");
}

TEST(Train, ABudgetsPlanIsMeasuredToFitOnTheFirstBatch) {
  TrainOptions budgeted = small_run();
  budgeted.plan = remat::PlanRequest::of_budget("40%");
  budgeted.plan.options().profile().repeats(1);
  Trainer trainer(budgeted);
  ASSERT_TRUE(trainer.budget_plan().has_value());
  EXPECT_GE(trainer.budget_plan()->measured_peak_bytes, 0);
  EXPECT_LE(trainer.budget_plan()->measured_peak_bytes, trainer.budget_plan()->budget_bytes);
  EXPECT_NE(trainer.plan_source().find("measured"), std::string::npos) << trainer.plan_source();
}

// Gradient accumulation: the batch as equal micro-batches, each loss scaled by 1/k, trains like the
// batch at once (the same sequences; equal up to float rounding: the sums are ordered differently).
TEST(Train, MicroBatchedTrainingEqualsTrainingTheWholeBatch) {
  TrainOptions whole = small_run("block");
  whole.model.dropout(0);  // dropout masks are drawn per forward: one batch or two halves differ
  whole.batch = 4;
  TrainOptions micro = whole;
  micro.micro_batch = 2;
  Trainer a(whole), b(micro);
  EXPECT_EQ(a.micro_batch(), 4);
  EXPECT_EQ(b.micro_batch(), 2);
  const RunOutcome plain = train_steps(a, 3), accumulated = train_steps(b, 3);
  ASSERT_EQ(plain.losses.size(), accumulated.losses.size());
  for (size_t i = 0; i < plain.losses.size(); ++i) EXPECT_NEAR(plain.losses[i], accumulated.losses[i], 1e-5) << i;
  ASSERT_EQ(plain.parameters.size(), accumulated.parameters.size());
  for (size_t i = 0; i < plain.parameters.size(); ++i) {
    // AdamW normalises each gradient: where one is ~0 by symmetry (the key projection's bias),
    // rounding noise moves its parameter by up to ~lr/1000 either way.
    EXPECT_TRUE(at::allclose(plain.parameters[i].second, accumulated.parameters[i].second, 1e-4, 1e-5))
        << plain.parameters[i].first << ": max |difference| "
        << (plain.parameters[i].second - accumulated.parameters[i].second).abs().max().item<double>();
  }

  TrainOptions uneven = whole;
  uneven.micro_batch = 3;
  EXPECT_NE(error_of([&] { Trainer t(uneven); }).find("TrainOptions::micro_batch must divide TrainOptions::batch (4)"),
            std::string::npos);
}

TEST(Train, MaximizingThroughputChoosesAMicroBatchAndAPlanThatFit) {
  TrainOptions o = small_run();
  o.batch = 4;
  o.plan = remat::PlanRequest::of_budget("30%");
  o.maximize_throughput = true;
  o.plan.options().profile().repeats(1);
  Trainer trainer(o);
  ASSERT_TRUE(trainer.throughput_choice().has_value());
  const remat::ThroughputChoice& choice = *trainer.throughput_choice();
  EXPECT_EQ(trainer.micro_batch(), choice.chosen().micro_batch);
  EXPECT_EQ(o.batch % trainer.micro_batch(), 0);
  ASSERT_TRUE(trainer.budget_plan().has_value());
  EXPECT_LE(trainer.budget_plan()->measured_peak_bytes, choice.budget_bytes);
  EXPECT_NE(trainer.plan_source().find("most throughput under budget 30%"), std::string::npos) << trainer.plan_source();
  EXPECT_TRUE(std::isfinite(trainer.step().loss));

  TrainOptions without_budget = small_run();
  without_budget.maximize_throughput = true;
  EXPECT_NE(error_of([&] {
              Trainer t(without_budget);
            }).find("TrainOptions::maximize_throughput needs a budget (PlanRequest::of_budget)"),
            std::string::npos);
}

TEST(Train, ResumeIntoAnotherConfigOrFromCorruptStateIsAClearErrorAndOverwritesNothing) {
  TempDir dir;
  const std::string state = (dir / "state").string();
  {
    Trainer trainer(small_run());
    train_steps(trainer, 2);
    trainer.save(state);
  }
  const fs::path step_dir = fs::path(state) / "step-000002";
  const std::string model_bytes = read_file(step_dir / "model.pt");

  TrainOptions other = small_run();
  other.model.hidden(64);
  other.resume_dir = state;
  REMAT_EXPECT_ERROR(Trainer{other}, "was saved for a model with hidden 32 but this run asks for 64");
  TrainOptions missing = small_run();
  missing.resume_dir = (dir / "nowhere").string();
  REMAT_EXPECT_ERROR(Trainer{missing}, "is not a directory of saved state");

  // Truncated: a crash of some other writer, or a copy cut short.
  write_file(dir / "model.backup", model_bytes);
  write_file(step_dir / "model.pt", model_bytes.substr(0, model_bytes.size() / 2));
  TrainOptions resume = small_run();
  resume.resume_dir = state;
  REMAT_EXPECT_ERROR(Trainer{resume}, "is truncated or was changed");
  // Same size, one byte flipped.
  std::string flipped = model_bytes;
  flipped[flipped.size() / 2] ^= 0x5a;
  write_file(step_dir / "model.pt", flipped);
  REMAT_EXPECT_ERROR(Trainer{resume}, "does not match its checksum");
  EXPECT_EQ(read_file(step_dir / "model.pt"), flipped) << "a failed resume must not write";

  write_file(step_dir / "model.pt", model_bytes);
  Trainer ok(resume);
  EXPECT_EQ(ok.global_step(), 2);
}

TEST(Train, SavesEveryNStepsAndResumesFromTheNewest) {
  TempDir dir;
  TrainOptions o = small_run("block");
  o.save_dir = (dir / "run").string();
  o.save_every = 2;
  o.keep_last = 2;
  Trainer trainer(o);
  train_steps(trainer, 5);
  EXPECT_TRUE(fs::is_directory(dir / "run" / "step-000002"));
  EXPECT_TRUE(fs::is_directory(dir / "run" / "step-000004"));
  EXPECT_FALSE(fs::exists(dir / "run" / "step-000005")) << "step 5 is not a multiple of 2";
  trainer.save();  // the end of a run
  EXPECT_FALSE(fs::exists(dir / "run" / "step-000002")) << "only the newest 2 are kept";
  TrainOptions resume = small_run("block");
  resume.resume_dir = o.save_dir;
  Trainer resumed(resume);
  EXPECT_EQ(resumed.global_step(), 5);

  TrainOptions bad = small_run();
  bad.save_every = 3;
  EXPECT_NE(error_of([&] { Trainer t(bad); }).find("save_every needs TrainOptions::save_dir"), std::string::npos);
}

// Issue 39: a folder at `latest` failed the save only after the whole run had trained.
TEST(Train, AFolderAtLatestIsRefusedBeforeTheFirstStep) {
  TempDir dir;
  fs::create_directories(dir / "run" / "latest");
  TrainOptions o = small_run();
  o.save_dir = (dir / "run").string();
  REMAT_EXPECT_ERROR(Trainer{o}, "its 'latest' is a folder, but a save writes the name of the newest state there");
  REMAT_EXPECT_ERROR(remat::train::check_state_dir_writable(dir / "run"), "Move that folder away");
  EXPECT_TRUE(fs::is_directory(dir / "run" / "latest")) << "the folder is the user's: left alone";
}

TEST(Train, AResumedRunMustTrainOnTheSameCorpus) {
  TempDir dir;
  TrainOptions o = small_run("block");
  o.save_dir = (dir / "run").string();
  {
    Trainer trainer(o);
    train_steps(trainer, 1);
    trainer.save();
  }
  write_file(dir / "other.txt", std::string(4096, 'z'));
  TrainOptions resume = small_run("block");
  resume.resume_dir = o.save_dir;
  resume.data_file = (dir / "other.txt").string();
  const std::string message = error_of([&] { Trainer t(resume); });
  EXPECT_NE(message.find("TrainOptions::resume_dir: the saved run trained on"), std::string::npos) << message;
  EXPECT_NE(message.find("Resume with the same TrainOptions::data_file"), std::string::npos) << message;
}

TEST(Train, AnUnwritableStateFolderIsRefusedBeforeTheFirstStep) {
  TempDir dir;
  write_file(dir / "a-file", "not a folder");
  TrainOptions o = small_run("block");
  o.save_dir = (dir / "a-file" / "state").string();
  REMAT_EXPECT_ERROR(Trainer t(o), "cannot create the state directory");
}

// Lengths drawn per step: each step's batch has one of them; under a budget each length runs its own
// plan (three profiled, the others planned from the fitted costs), every step's activation peak
// within its length's budget, the fitted prediction of a length never profiled exact in bytes.
TEST(Train, VariableLengthsRunAPlanPerLengthEachWithinItsBudget) {
  TrainOptions o = small_run();
  o.model.sequence(32);
  o.lengths = {8, 16, 24, 32, 12};
  o.plan = remat::PlanRequest::of_budget("60%");
  o.plan.options().profile().repeats(1);
  Trainer trainer(o);
  ASSERT_TRUE(trainer.length_costs().has_value()) << "fitted over the lengths profiled";
  EXPECT_EQ(trainer.length_costs()->fitted_shapes(), (std::vector<std::vector<int64_t>>{{8}, {16}, {32}}));
  ASSERT_EQ(trainer.length_plans().count(32), 1u) << "the longest planned before the first step, as plan()";
  std::set<int64_t> seen = {32};
  std::map<int64_t, int64_t> peaks;  // from step 2
  for (int i = 0; i < 24; ++i) {
    const remat::train::StepRecord r = trainer.step();
    SCOPED_TRACE("step " + std::to_string(r.step) + ", length " + std::to_string(r.sequence));
    ASSERT_TRUE(std::count(o.lengths.begin(), o.lengths.end(), r.sequence) == 1);
    EXPECT_EQ(r.tokens, o.batch * r.sequence);
    ASSERT_GE(r.budget_bytes, 0);
    if (r.step > 1) {  // step 1 also allocates the gradients
      EXPECT_LE(r.activation_peak_bytes, r.budget_bytes);
      peaks[r.sequence] = std::max(peaks[r.sequence], r.activation_peak_bytes);
    }
    EXPECT_EQ(r.planning_seconds > 0, seen.insert(r.sequence).second) << "planned once, on its first step";
  }
  EXPECT_GE(seen.size(), 4u);
  for (const auto& [length, planned] : trainer.length_plans()) {
    EXPECT_EQ(planned.from_fit, length == 12 || length == 24) << length;
    // The peak predicted from the costs (fitted, for a length never profiled) against the measured one.
    if (peaks.count(length) == 0) continue;
    const double measured = static_cast<double>(peaks[length]);
    EXPECT_NEAR(static_cast<double>(planned.result.prediction.peak_bytes), measured, 0.05 * measured) << length;
  }

  TrainOptions too_long = o;
  too_long.lengths = {8, 33};
  REMAT_EXPECT_ERROR(Trainer{too_long}, "a length of 33 lies outside [1, GptConfig::sequence = 32]");
  TrainOptions with_throughput = o;
  with_throughput.maximize_throughput = true;
  REMAT_EXPECT_ERROR(Trainer{with_throughput}, "TrainOptions::lengths and TrainOptions::maximize_throughput");
}
