// Training the GPT: every policy trains exactly like `none`, resume equals a straight run, and bad
// input (flags, data, plans, saved state) is a clear error that leaves saved state untouched.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/models/gpt_policies.h"
#include "remat/train/presets.h"
#include "remat/chain/plan.h"
#include "remat/chain/policies.h"
#include "remat/planning/cost_model.h"
#include "remat/train/state_dir.h"
#include "remat/train/trainer.h"
#include "support/compare.h"

namespace fs = std::filesystem;
using remat::train::Trainer;
using remat::train::TrainOptions;

using remat::testing::error_of;

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

class TempDir {
 public:
  TempDir()
      : path_(fs::temp_directory_path() /
              ("remat-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path operator/(const std::string& name) const { return path_ / name; }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

void write_file(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST(Train, EveryPolicyTrainsExactlyLikeNoneInBothCheckpointModes) {
  Trainer reference(small_run("none"));
  const RunOutcome none = train_steps(reference, 3);
  for (const auto mode : {remat::CheckpointMode::reentrant, remat::CheckpointMode::non_reentrant}) {
    for (const std::string policy : {"block", "every:2", "segments:2", "sqrt", "ffn", "attn", "ffn+attn", "selective",
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
    "options": ["full", "full", "selective", "full", "full", "full"],
    "plan": [{"checkpoint": ["embed", {"checkpoint": ["block0"]}, "block1"]},
             {"checkpoint": [{"checkpoint": ["block2", "block3"]}, "head"]}]})");
  Trainer reference(small_run("none"));
  const RunOutcome none = train_steps(reference, 3);
  TrainOptions o = small_run();
  o.plan = remat::PlanRequest::of_plan_file((dir / "nested.json").string());
  Trainer trainer(o);
  EXPECT_EQ(trainer.plan().to_string(), "[embed [block0] block1:selective] [[block2 block3] head]");
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

  TrainOptions second_half = small_run("selective");  // the policy may change; the model may not
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
  o.plan.profile().repeats(0);
  REMAT_EXPECT_ERROR(Trainer{o}, "ProfileOptions::repeats must be at least 1, got 0");
}

TEST(Train, ABudgetIsPlannedForAndTrainsLikeNone) {
  TrainOptions budgeted = small_run();
  budgeted.plan = remat::PlanRequest::of_budget("50%");
  budgeted.plan.profile().repeats(1);
  Trainer trainer(budgeted);
  ASSERT_TRUE(trainer.budget_plan().has_value());
  EXPECT_LE(trainer.budget_plan()->prediction.peak_bytes, trainer.budget_plan()->budget_bytes);
  EXPECT_NE(
      trainer.plan().to_string(),
      remat::Plan::plain(remat::models::GptChain(trainer.model(), remat::models::GptGranularity::half)).to_string());
  EXPECT_NE(trainer.plan_source().find("optimal for budget 50%"), std::string::npos) << trainer.plan_source();
  const remat::PlanVerification v = trainer.verify();  // against the same stage options unchecked
  EXPECT_TRUE(v.bitwise_equal()) << v.to_string();
  // Profiling and verifying left the run as a straight one: the same losses as the plan's stage
  // options unchecked (`none` itself where it keeps every option at full; options such as fused
  // compute differently by design).
  const RunOutcome planned = train_steps(trainer, 3);
  TrainOptions same_options = small_run();
  remat::Plan unchecked =
      remat::Plan::plain(remat::models::GptChain(trainer.model(), remat::models::gpt_granularity_of(trainer.plan())));
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

TEST(Train, ABudgetsPlanIsMeasuredToFitOnTheFirstBatch) {
  TrainOptions budgeted = small_run();
  budgeted.plan = remat::PlanRequest::of_budget("40%");
  budgeted.plan.profile().repeats(1);
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
  o.plan.profile().repeats(1);
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

TEST(StateDir, ACrashWhileSavingKeepsThePreviousState) {
  TempDir dir;
  remat::train::save_state_dir(dir.path(), 1, {{"step", 1}},
                               [](const fs::path& into) { write_file(into / "a.bin", "first"); });
  EXPECT_THROW(remat::train::save_state_dir(dir.path(), 2, {{"step", 2}},
                                            [](const fs::path& into) {
                                              write_file(into / "a.bin", "half-writ");
                                              throw std::runtime_error("disk full");
                                            }),
               std::runtime_error);
  const auto [state, meta] = remat::train::load_state_dir(dir.path());
  EXPECT_EQ(meta["step"], 1);
  EXPECT_EQ(read_file(state / "a.bin"), "first");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 2) << "only 'latest' and step-000001 remain: no temporary directory is left behind";
}

TEST(StateDir, KeepsTheNewestStatesAndChecksMetaJsonItself) {
  TempDir dir;
  for (int step = 1; step <= 4; ++step) {
    remat::train::save_state_dir(
        dir.path(), step, {{"step", step}},
        [&](const fs::path& into) { write_file(into / "a.bin", std::to_string(step)); }, 2);
  }
  std::vector<std::string> states;
  for (const auto& e : fs::directory_iterator(dir.path())) states.push_back(e.path().filename().string());
  std::sort(states.begin(), states.end());
  EXPECT_EQ(states, (std::vector<std::string>{"latest", "step-000003", "step-000004"}));
  const auto [state, meta] = remat::train::load_state_dir(dir.path());
  EXPECT_EQ(meta["step"], 4);

  // One changed digit in meta.json (not in any data file) is caught, and the error stays short.
  const fs::path meta_path = state / "meta.json";
  std::string text = read_file(meta_path);
  const auto at = text.find("\"step\": 4");
  ASSERT_NE(at, std::string::npos) << text;
  text[at + 8] = '5';
  write_file(meta_path, text);
  const std::string message = error_of([&] { remat::train::load_state_dir(dir.path()); });
  EXPECT_NE(message.find("meta.json' does not match its checksum"), std::string::npos) << message;
  EXPECT_LT(message.size(), 600u) << message;
  REMAT_EXPECT_ERROR(remat::train::save_state_dir(
                         dir.path(), 5, {}, [](const fs::path&) {}, 0),
                     "keep_last must be at least 1");
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

// Re-saving a step (train --steps 0 --resume D --save-state D) killed before each of its file
// operations in turn: whatever instant the kill comes at, the folder loads a complete state (the old
// or the new one), and the next save leaves nothing of the dead one behind.
TEST(StateDir, AResaveKilledBeforeAnyFileOperationLosesNothing) {
  auto state_of = [](const fs::path& dir) {
    const auto [state, meta] = remat::train::load_state_dir(dir);
    return read_file(state / "a.bin");
  };
  bool reached_the_end = false;
  for (int operation = 1; !reached_the_end && operation < 64; ++operation) {
    TempDir dir;
    remat::train::save_state_dir(dir.path(), 7, {{"step", 7}},
                                 [](const fs::path& into) { write_file(into / "a.bin", "old"); });
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {  // only file operations here: no LibTorch in the forked child
      try {
        remat::train::crash_state_save_before_operation_for_testing(operation);
        remat::train::save_state_dir(dir.path(), 7, {{"step", 7}},
                                     [](const fs::path& into) { write_file(into / "a.bin", "new"); });
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    reached_the_end = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    EXPECT_TRUE(reached_the_end || (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)) << "operation " << operation;
    const std::string loaded = state_of(dir.path());
    EXPECT_TRUE(loaded == "old" || loaded == "new") << "killed before operation " << operation << ": " << loaded;
    if (reached_the_end) EXPECT_EQ(loaded, "new");
    // The next save (in this process) removes what the dead one left.
    remat::train::save_state_dir(dir.path(), 8, {{"step", 8}},
                                 [](const fs::path& into) { write_file(into / "a.bin", "next"); });
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-000008"}))
        << "after a kill before operation " << operation;
    EXPECT_EQ(state_of(dir.path()), "next");
  }
  EXPECT_TRUE(reached_the_end) << "the hook never let a save finish";
}

TEST(StateDir, DeletingTheChecksumKeyDoesNotTurnVerificationOff) {
  TempDir dir;
  const fs::path state = remat::train::save_state_dir(dir.path(), 3, {{"step", 3}},
                                                      [](const fs::path& into) { write_file(into / "a.bin", "x"); });
  nlohmann::json meta = nlohmann::json::parse(read_file(state / "meta.json"));
  meta.erase("meta_fnv1a64");
  meta["step"] = 300;
  write_file(state / "meta.json", meta.dump(2));
  REMAT_EXPECT_ERROR(remat::train::load_state_dir(dir.path()), "meta.json' has no checksum (meta_fnv1a64)");
}

// Saved state behind links and special files: `latest` is replaced as a name (a planted link is
// replaced, never written through), and every file of a state is read without blocking, checked
// to be a regular file of a bounded size on the opened descriptor, and said missing when it is.
TEST(StateDir, ALinkPlantedAsLatestIsReplacedNotWrittenThrough) {
  TempDir dir;
  const fs::path victim = dir.path() / "victim.txt";
  write_file(victim, "precious");
  const fs::path state_dir = dir.path() / "state";
  fs::create_directories(state_dir);
  fs::create_symlink("../victim.txt", state_dir / "latest");
  remat::train::save_state_dir(state_dir, 2, {{"step", 2}},
                               [](const fs::path& into) { write_file(into / "a.bin", "x"); });
  EXPECT_EQ(read_file(victim), "precious") << "the file the link named is untouched";
  EXPECT_FALSE(fs::is_symlink(state_dir / "latest")) << "the link itself was replaced by the new 'latest'";
  EXPECT_EQ(read_file(state_dir / "latest"), "step-000002\n");
  EXPECT_EQ(remat::train::load_state_dir(state_dir).second["step"], 2);
}

TEST(StateDir, SpecialFilesInAStateAreRefusedWithoutBlocking) {
  TempDir dir;
  const auto save = [&] {
    fs::remove_all(dir.path() / "s");
    return remat::train::save_state_dir(dir.path() / "s", 1, {{"step", 1}},
                                        [](const fs::path& into) { write_file(into / "model.pt", "weights"); });
  };
  const auto load = [&] { return error_of([&] { remat::train::load_state_dir(dir.path() / "s"); }); };
  const auto started = std::chrono::steady_clock::now();
  fs::path state = save();
  // A FIFO as `latest`: a plain open would wait for a writer forever.
  fs::remove(dir.path() / "s" / "latest");
  ASSERT_EQ(::mkfifo((dir.path() / "s" / "latest").c_str(), 0600), 0);
  EXPECT_NE(load().find("the state's 'latest' file '" + (dir.path() / "s" / "latest").string() + "' is a FIFO"),
            std::string::npos)
      << load();
  // A FIFO or a folder where a state file was.
  state = save();
  fs::remove(state / "model.pt");
  ASSERT_EQ(::mkfifo((state / "model.pt").c_str(), 0600), 0);
  EXPECT_NE(load().find("model.pt' is not a regular file (a FIFO)"), std::string::npos) << load();
  state = save();
  fs::remove(state / "model.pt");
  fs::create_directory(state / "model.pt");
  EXPECT_NE(load().find("model.pt' is not a regular file (a folder)"), std::string::npos) << load();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10)) << "nothing waited on a FIFO";
  // Missing files are missing, not "invalid JSON".
  state = save();
  fs::remove(state / "model.pt");
  EXPECT_NE(load().find("state file '" + (state / "model.pt").string() + "' is missing."), std::string::npos) << load();
  state = save();
  fs::remove(state / "meta.json");
  EXPECT_NE(load().find("meta.json' is missing; the state is corrupt."), std::string::npos) << load();
  // meta.json padded with NULs to 70 MB: refused by its size before it is read.
  state = save();
  { std::ofstream(state / "meta.json", std::ios::app) << std::string(70u << 20, '\0'); }
  EXPECT_NE(load().find("holds 73400"), std::string::npos) << load();
  EXPECT_NE(load().find("more than the 16777216"), std::string::npos) << load();
  // A few NULs (which the JSON parser would stop at), then text that is not JSON: both in remat's
  // words, no nlohmann exception text.
  state = save();
  { std::ofstream(state / "meta.json", std::ios::app) << std::string(8, '\0'); }
  EXPECT_NE(load().find("meta.json' holds a NUL byte at byte "), std::string::npos) << load();
  write_file(state / "meta.json", "{\"files\": [1, 2,");
  EXPECT_NE(load().find("is not valid JSON (it stops making sense at byte"), std::string::npos) << load();
  EXPECT_EQ(load().find("json.exception"), std::string::npos) << load();
}

TEST(StateDir, LatestMustNameOneStateFolderAndIsQuotedPrintably) {
  TempDir dir;
  remat::train::save_state_dir(dir.path(), 1, {{"step", 1}},
                               [](const fs::path& into) { write_file(into / "a.bin", "x"); });
  const auto load = [&] { return error_of([&] { remat::train::load_state_dir(dir.path()); }); };
  write_file(dir.path() / "latest", "step-000001\r\n");
  EXPECT_NE(load().find("but holds 'step-000001\\r'"), std::string::npos) << load();
  write_file(dir.path() / "latest", "../../etc\n");
  EXPECT_NE(load().find("should name one state folder (like step-000040) but holds '../../etc'"), std::string::npos)
      << load();
  write_file(dir.path() / "latest", "\x1b[31mred\n");
  EXPECT_NE(load().find("holds '\\x1b[31mred'"), std::string::npos) << load();
  write_file(dir.path() / "latest", std::string(5000, 'a'));
  EXPECT_NE(load().find("holds 5000 bytes, more than the 4096"), std::string::npos) << load();
  write_file(dir.path() / "latest", "step-000001\n");
  EXPECT_EQ(remat::train::load_state_dir(dir.path()).second["step"], 1);
}

// Issue 39: a save deleted a user's .old-notes/, .tmp-mine/, step-0000-notes/, step-000001-backup/
// and .tmp-userfile-99999998 from the state folder. Only names remat writes, exactly, are removed:
// its states (step- and six digits, a re-save's .K) and its dead saves' temporaries.
TEST(StateDir, SavesRemoveOnlyWhatRematWrote) {
  TempDir dir;
  const std::vector<std::string> users = {".old-notes", ".tmp-mine",    "step-0000-notes", "step-000001-backup",
                                          "step-1",     "step-000002x", "step-000003.01",  ".tmp-step-000001-x"};
  for (const auto& name : users) {
    fs::create_directories(dir.path() / name);
    write_file(dir.path() / name / "marker", name);
  }
  write_file(dir.path() / ".tmp-userfile-99999998", "mine");
  write_file(dir.path() / "step-000000", "a file, not a state");
  fs::create_directories(dir.path() / "step-000001");  // a folder of a state's name, but no state in it
  write_file(dir.path() / "step-000001" / "marker", "mine");
  // What a save killed by kill -9 leaves (a process id that cannot be alive: above pid_max).
  fs::create_directories(dir.path() / ".tmp-step-000007-99999998");
  write_file(dir.path() / "latest.tmp.99999998.0", "step-000007\n");
  for (int step = 2; step <= 5; ++step) {
    remat::train::save_state_dir(dir.path(), step, {{"step", step}},
                                 [&](const fs::path& into) { write_file(into / "a.bin", std::to_string(step)); });
  }
  // A re-save of step 5 (step-000005.1) and then later steps prune both of step 5's states.
  remat::train::save_state_dir(
      dir.path(), 5, {{"step", 5}}, [](const fs::path& into) { write_file(into / "a.bin", "5 again"); }, 2);
  EXPECT_TRUE(fs::is_directory(dir.path() / "step-000005")) << "kept: the newest 2 are step-000005 and its re-save";
  EXPECT_TRUE(fs::is_directory(dir.path() / "step-000005.1"));
  remat::train::save_state_dir(dir.path(), 6, {{"step", 6}},
                               [](const fs::path& into) { write_file(into / "a.bin", "6"); });

  for (const auto& name : users) {
    EXPECT_EQ(read_file(dir.path() / name / "marker"), name) << name << " was removed or changed";
  }
  EXPECT_EQ(read_file(dir.path() / ".tmp-userfile-99999998"), "mine");
  EXPECT_EQ(read_file(dir.path() / "step-000000"), "a file, not a state");
  EXPECT_EQ(read_file(dir.path() / "step-000001" / "marker"), "mine");
  // remat's own leftovers and old states are gone, as before.
  EXPECT_FALSE(fs::exists(dir.path() / ".tmp-step-000007-99999998")) << "a dead save's temporary stays";
  EXPECT_FALSE(fs::exists(dir.path() / "latest.tmp.99999998.0")) << "a dead save's 'latest' temporary stays";
  for (const char* old : {"step-000002", "step-000003", "step-000004", "step-000005", "step-000005.1"}) {
    EXPECT_FALSE(fs::exists(dir.path() / old)) << old << " was not pruned";
  }
  EXPECT_EQ(remat::train::load_state_dir(dir.path()).second["step"], 6);
}

// Issue 39: a meta.json with one extra field nested 100,000 deep passed the parser, then its
// checksum's dump() recursed until the stack overflowed (SIGSEGV). Refused before parsing; and so
// is a plan or a profile nested as deep.
TEST(StateDir, ADeeplyNestedMetaJsonIsRefusedBeforeParsing) {
  TempDir dir;
  const fs::path state = remat::train::save_state_dir(dir.path(), 1, {{"step", 1}},
                                                      [](const fs::path& into) { write_file(into / "a.bin", "x"); });
  std::string meta = read_file(state / "meta.json");
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  meta.insert(meta.find('{') + 1, "\"extra\": " + deep + ", ");
  write_file(state / "meta.json", meta);
  const auto start = std::chrono::steady_clock::now();
  const std::string message = error_of([&] { remat::train::load_state_dir(dir.path()); });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  EXPECT_NE(message.find("meta.json': the JSON nests arrays and objects more than 16 levels deep"), std::string::npos)
      << message;
  EXPECT_NE(message.find("the state is corrupt. Resume from another copy"), std::string::npos) << message;

  const std::string deep_plan = "{\"format\": \"remat-plan\", \"plan\": " + deep + "}";
  REMAT_EXPECT_ERROR(remat::Plan::from_json(deep_plan, "deep.json"),
                     "deep.json: the JSON nests arrays and objects more than 515 levels deep");
  REMAT_EXPECT_ERROR(remat::CostTable::from_json("{\"stages\": " + deep + "}", "deep-profile.json"),
                     "deep-profile.json: the JSON nests arrays and objects more than");
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

// The presets are data (train/presets.json, embedded at configure time and read by
// bench/pytorch_side_by_side.py too): the values tools rely on, and the side-by-side policies.

TEST(Presets, TheEmbeddedFileHoldsTheFourPresetsInOrder) {
  EXPECT_EQ(remat::train::preset_names(), "demo, reference, 7b, 13b");
  const remat::train::Preset& demo = remat::train::preset("demo");
  EXPECT_TRUE(demo.runnable);
  EXPECT_EQ(demo.steps, std::optional<int64_t>(300));
  EXPECT_EQ(demo.lr, std::optional<double>(2e-3));
  EXPECT_EQ(demo.warmup_steps, std::optional<int64_t>(30));
  const remat::train::Preset& big = remat::train::preset("13b");
  EXPECT_FALSE(big.runnable);
  EXPECT_EQ(big.model.layers(), 40);
  EXPECT_EQ(big.model.vocabulary(), 32000);
  EXPECT_EQ(big.dtype, "bf16");
  REMAT_EXPECT_ERROR(remat::train::preset("nope"), "unknown preset 'nope'; the presets are demo, reference, 7b, 13b.");
}

TEST(Presets, TheReferencePresetIsTheReferenceWorkload) {
  const remat::train::Preset& p = remat::train::preset("reference");
  EXPECT_TRUE(p.runnable);
  EXPECT_EQ(p.model.layers(), 8);
  EXPECT_EQ(p.model.hidden(), 256);
  EXPECT_EQ(p.model.heads(), 8);
  EXPECT_EQ(p.model.sequence(), 256);
  EXPECT_EQ(p.model.vocabulary(), 256);
  EXPECT_DOUBLE_EQ(p.model.dropout(), 0.1);
  EXPECT_EQ(p.batch, 8);
  EXPECT_FALSE(p.steps.has_value());
  EXPECT_FALSE(p.lr.has_value());
  EXPECT_FALSE(p.warmup_steps.has_value());
  EXPECT_EQ(p.dtype, "fp32");
}

TEST(Presets, EverySideBySidePolicyIsOneTheGptAccepts) {
  const std::vector<std::string>& policies = remat::train::side_by_side_policies();
  ASSERT_FALSE(policies.empty());
  EXPECT_EQ(policies.front(), "none");  // the baseline of the comparison's time ratios and losses
  for (const std::string& policy : policies) {
    EXPECT_NO_THROW(remat::models::gpt_policy_granularity(policy)) << policy;
  }
}
