// remat/chain/plan.h: plans' compact form, JSON round trips and validation errors, and run_plan (checked against
// its chain, observed, graph-only segment ends, the chain needed until backward).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/chain/chain.h"
#include "remat/chain/plan.h"
#include "remat/chain/policies.h"
#include "remat/chain/sequential_chain.h"
#include "remat/planning/cost_model.h"
#include "support/compare.h"
#include "support/sequential_models.h"

namespace nn = torch::nn;
using remat::Plan;
using remat::testing::mlp;

namespace {

// A chain of named stages that only says what it offers (plans are checked against it, never run).
class ToyChain : public remat::Chain {
 public:
  ToyChain(std::string granularity, std::vector<remat::StageInfo> stages)
      : granularity_(std::move(granularity)), stages_(std::move(stages)) {}
  /// embed, `blocks` stages of blocks (named block0.. or, at "half", attn0 mlp0 ..), head.
  static ToyChain of_blocks(int64_t blocks, const std::string& granularity = "block") {
    std::vector<remat::StageInfo> stages = {{"embed", -1, {"full"}}};
    for (int64_t b = 0; b < blocks; ++b) {
      if (granularity == "half") {
        stages.push_back({"attn" + std::to_string(b), b, {"full", "selective"}});
        stages.push_back({"mlp" + std::to_string(b), b, {"full"}});
      } else {
        stages.push_back({"block" + std::to_string(b), b, {"full", "selective"}});
      }
    }
    stages.push_back({"head", -1, {"full"}});
    return ToyChain(granularity, stages);
  }
  const std::vector<remat::StageInfo>& stages() const override { return stages_; }
  std::string granularity() const override { return granularity_; }
  at::Tensor forward_stage(int64_t, const at::Tensor& input, const std::string&) override { return input; }

 private:
  std::string granularity_;
  std::vector<remat::StageInfo> stages_;
};

const char* kValidPlan = R"({"format": "remat-plan", "version": 1, "granularity": "block",
  "stages": ["embed", "block0", "block1", "head"], "options": ["full", "full", "selective", "full"],
  "plan": ["embed", {"checkpoint": ["block0", {"checkpoint": ["block1"]}]}, "head"]})";

}  // namespace

TEST(Plan, JsonRoundTripKeepsNestingAndOptions) {
  Plan plan = Plan::from_json(kValidPlan, "nested.json");
  // A plan file without default options shows every option, until bound to its chain.
  EXPECT_EQ(plan.to_string(), "embed:full [block0:full [block1:selective]] head:full");
  plan.bind_to(ToyChain::of_blocks(2));
  EXPECT_EQ(plan.to_string(), "embed [block0 [block1:selective]] head");
  EXPECT_EQ(plan.recompute_depths(), (std::vector<int64_t>{0, 1, 2, 0}));
  const Plan again = Plan::from_json(plan.to_json());
  EXPECT_EQ(again.to_string(), plan.to_string());
  EXPECT_EQ(again.options, plan.options);
  plan.validate_against(ToyChain::of_blocks(2));
}

TEST(Plan, JsonRoundTripKeepsTheCheckpointMode) {
  Plan plan;
  plan.granularity = "stages";
  plan.stage_names = {"a", "b"};
  plan.options = {"full", "full"};
  plan.default_options = plan.options;
  plan.items = {remat::PlanItem::checkpointed({remat::PlanItem::run(0)}), remat::PlanItem::run(1)};
  EXPECT_EQ(Plan::from_json(plan.to_json()).mode, remat::CheckpointMode::reentrant);
  plan.mode = remat::CheckpointMode::non_reentrant;
  const Plan again = Plan::from_json(plan.to_json());
  EXPECT_EQ(again.mode, remat::CheckpointMode::non_reentrant);
  EXPECT_EQ(again.to_string(), "[a] b (non-reentrant)");
  std::string bad = plan.to_json();
  bad.replace(bad.find("\"non-reentrant\""), 15, "\"sideways\"");
  REMAT_EXPECT_ERROR(Plan::from_json(bad, "p.json"),
                     "p.json: field 'checkpoint_mode' must be \"reentrant\" or \"non-reentrant\"");
}

TEST(Plan, MalformedJsonIsAClearError) {
  REMAT_EXPECT_ERROR(Plan::from_json("{not json", "p.json"), "p.json: not valid JSON");
  REMAT_EXPECT_ERROR(Plan::from_json("[]", "p.json"), "not a remat plan");
  REMAT_EXPECT_ERROR(Plan::from_json(R"({"format": "remat-plan", "version": 7})", "p.json"),
                     "version 7 is not supported");
  REMAT_EXPECT_ERROR(Plan::from_json(R"({"format": "remat-plan", "version": 1, "granularity": "block"})", "p.json"),
                     "field 'stages' must be");
  auto with_plan = [](const std::string& plan_array, const std::string& options = R"(["full","full","full","full"])") {
    return R"({"format": "remat-plan", "version": 1, "granularity": "block",
      "stages": ["embed", "block0", "block1", "head"], "options": )" +
           options + R"(, "plan": )" + plan_array + "}";
  };
  REMAT_EXPECT_ERROR(Plan::from_json(with_plan(R"(["embed", "block7", "block1", "head"])")), "unknown stage 'block7'");
  REMAT_EXPECT_ERROR(Plan::from_json(with_plan(R"(["embed", "block1", "block0", "head"])")),
                     "expected 'block0' but found 'block1'");
  REMAT_EXPECT_ERROR(Plan::from_json(with_plan(R"(["embed", "block0", "block0", "block1", "head"])")),
                     "expected 'block1' but found 'block0'");
  REMAT_EXPECT_ERROR(Plan::from_json(with_plan(R"(["embed", {"checkpoint": []}, "block0", "block1", "head"])")),
                     "segment is empty");
  REMAT_EXPECT_ERROR(Plan::from_json(with_plan(R"(["embed", "block0"])")), "the plan stops at stage 'block1'");
  REMAT_EXPECT_ERROR(Plan::from_json(with_plan(R"(["embed", {"keep": ["block0"]}, "block1", "head"])")),
                     "expected a stage name or");
  REMAT_EXPECT_ERROR(Plan::from_json(with_plan(R"(["embed", "block0", "block1", "head"])", R"(["full"])")),
                     "'options' has 1 entries");
}

TEST(Plan, DeepNestingIsRefusedWithoutRecursingIntoIt) {
  // 20,000 levels: parsed, measured and refused with a stack of its own (recursion would overflow).
  const int levels = 20000;
  std::string deep;
  for (int i = 0; i < levels; ++i) deep += R"({"checkpoint": [)";
  deep += R"("block0")";
  for (int i = 0; i < levels; ++i) deep += "]}";
  const std::string text = R"({"format": "remat-plan", "version": 1, "granularity": "block",
    "stages": ["embed", "block0", "block1", "head"], "options": ["full","full","full","full"], "plan": ["embed", )" +
                           deep + R"(, "block1", "head"]})";
  REMAT_EXPECT_ERROR(Plan::from_json(text, "deep.json"), "deep.json: the JSON nests arrays and objects more than 515");
  // Deeper than its stages: meaningless, refused with the numbers.
  const std::string five = R"({"format": "remat-plan", "version": 1, "granularity": "block",
    "stages": ["embed", "block0", "block1", "head"], "options": ["full","full","full","full"],
    "plan": ["embed", {"checkpoint": [{"checkpoint": [{"checkpoint": [{"checkpoint": [{"checkpoint": ["block0"]}]}]}]}]},
             "block1", "head"]})";
  REMAT_EXPECT_ERROR(
      Plan::from_json(five, "five.json"),
      "five.json: field 'plan' nests checkpoints more than 4 levels deep; a plan of 4 stages can use at most 4");
  // A deep element where a stage is expected is described, not serialised.
  std::string arrays(levels, '[');
  arrays += std::string(levels, ']');
  REMAT_EXPECT_ERROR(Plan::from_json(R"({"format": "remat-plan", "version": 1, "stages": )" + arrays + "}", "a.json"),
                     "a.json: the JSON nests arrays and objects more than 515 levels deep");
}

TEST(Plan, AProgrammaticPlanNestedTooDeepIsRefusedByValidationAndSimulation) {
  Plan plan;
  plan.granularity = "stages";
  for (int i = 0; i < 300; ++i) {
    plan.stage_names.push_back("s" + std::to_string(i));
    plan.options.push_back("full");
  }
  std::vector<remat::PlanItem> items{remat::PlanItem::run(0)};
  for (int level = 0; level < 5000; ++level) items = {remat::PlanItem::checkpointed(std::move(items))};
  plan.items = std::move(items);
  for (int i = 1; i < 300; ++i) plan.items.push_back(remat::PlanItem::run(i));
  remat::CostTable costs;
  costs.stages.resize(300);
  REMAT_EXPECT_ERROR(
      remat::simulate(plan, costs),
      "simulate: checkpointed segments nest more than 256 levels deep; a plan of 300 stages can use at most 256");
  REMAT_EXPECT_ERROR(plan.check_nesting("the plan"), "more than 256 levels deep");
}

TEST(Plan, AFileListingMoreStagesThanTheModelHasIsRefusedWhileRead) {
  const Plan plan = Plan::from_json(kValidPlan, "plan.json", 4);  // exactly as many: accepted
  EXPECT_EQ(plan.stage_names.size(), 4u);
  REMAT_EXPECT_ERROR(
      Plan::from_json(kValidPlan, "plan.json", 3),
      "plan.json: field 'stages' lists more than 3 entries, but this model's chains have at most 3 stages");
  // A malformed file is still reported by the full parse, in its words.
  REMAT_EXPECT_ERROR(Plan::from_json("{\"stages\": [1, 2", "plan.json", 3), "plan.json: not valid JSON");
}

TEST(Plan, APlanForAnotherChainIsRefused) {
  const Plan plan = Plan::from_json(kValidPlan);  // 2 blocks
  REMAT_EXPECT_ERROR(plan.validate_against(ToyChain::of_blocks(4)),
                     "the plan was made for a chain of 4 stages at granularity 'block'");
  REMAT_EXPECT_ERROR(plan.validate_against(ToyChain::of_blocks(2, "half")),
                     "this model's chain has 6 stages at granularity 'half'");
  Plan bad_option = Plan::from_json(kValidPlan);
  bad_option.options[3] = "selective";
  REMAT_EXPECT_ERROR(bad_option.validate_against(ToyChain::of_blocks(2)),
                     "stage 'head' has no option 'selective'; it offers: full");
  // Checked by name: a chain of the same length and granularity with other names is another chain.
  ToyChain renamed("block", {{"stem", -1, {"full"}},
                             {"conv0", 0, {"full", "selective"}},
                             {"conv1", 1, {"full", "selective"}},
                             {"head", -1, {"full"}}});
  REMAT_EXPECT_ERROR(plan.validate_against(renamed), "stem");
}

namespace {

// Stage i: x·w_i then tanh; logs which entry point ran it, and in which phase.
class RecordingChain : public remat::Chain {
 public:
  explicit RecordingChain(int64_t n, const std::string& prefix = "s", std::string granularity = "block")
      : granularity_(std::move(granularity)) {
    for (int64_t i = 0; i < n; ++i) {
      stages_.push_back({prefix + std::to_string(i), i, {"full"}});
      weights.push_back(torch::randn({4}, torch::requires_grad()));
    }
  }
  const std::vector<remat::StageInfo>& stages() const override { return stages_; }
  std::string granularity() const override { return granularity_; }
  at::Tensor forward_stage(int64_t index, const at::Tensor& input, const std::string&) override {
    log.push_back(stages_[index].name);
    return (input * weights[index]).tanh();
  }
  at::Tensor forward_stage_graph_only(int64_t index, const at::Tensor& input, const std::string&) override {
    log.push_back(stages_[index].name + "*");
    return (input * weights[index]).tanh();
  }
  std::vector<at::Tensor> weights;
  std::vector<std::string> log;

 private:
  std::string granularity_;
  std::vector<remat::StageInfo> stages_;
};

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : " ") + n;
  return out;
}

}  // namespace

// run_plan checks a plan by its stages' names and its granularity, as validate_against does: a plan
// of another chain of the same length would otherwise checkpoint the wrong stages silently.
TEST(Plan, RunPlanRefusesAPlanOfAnotherChainOfTheSameLength) {
  RecordingChain mine(3), other_names(3, "t"), other_granularity(3, "s", "half");
  Plan plan = Plan::unchecked(mine);
  plan.items = {remat::PlanItem::checkpointed({remat::PlanItem::run(0), remat::PlanItem::run(1)}),
                remat::PlanItem::run(2)};
  const at::Tensor x = torch::randn({4}, torch::requires_grad());
  REMAT_EXPECT_ERROR(remat::run_plan(other_names, plan, x), "(t0 t1 t2)");
  REMAT_EXPECT_ERROR(remat::run_plan(other_granularity, plan, x), "granularity 'half'");
  EXPECT_TRUE(other_names.log.empty() && other_granularity.log.empty()) << "refused before any stage ran";
  remat::run_plan(mine, plan, x).sum().backward();
  EXPECT_EQ(joined(mine.log), "s0 s1 s2 s0 s1*");
}

// The observed run is run_plan with calls around each top-level item: the same stages, output and
// gradients, the observer told of every item in order with that item's output.
TEST(Plan, AnObservedRunIsRunPlanWithEachTopLevelItemReported) {
  RecordingChain plain(4), observed(4);
  for (size_t i = 0; i < observed.weights.size(); ++i)
    observed.weights[i] = plain.weights[i].detach().clone().requires_grad_(true);
  Plan plan = Plan::unchecked(plain);
  plan.items = {remat::PlanItem::run(0),
                remat::PlanItem::checkpointed({remat::PlanItem::run(1), remat::PlanItem::run(2)}),
                remat::PlanItem::run(3)};
  const at::Tensor x = torch::randn({4});
  const at::Tensor expected = remat::run_plan(plain, plan, x);
  std::vector<std::string> events;
  remat::PlanItemObserver observer;
  observer.before = [&](size_t k) { events.push_back("before " + std::to_string(k)); };
  observer.after = [&](size_t k, const at::Tensor& out) {
    events.push_back("after " + std::to_string(k) + (out.requires_grad() ? " grad" : ""));
  };
  const at::Tensor got = remat::run_plan_observed(observed, plan, x, observer);
  EXPECT_TRUE(remat::testing::bitwise_equal(expected, got));
  EXPECT_EQ(joined(events), "before 0 after 0 grad before 1 after 1 grad before 2 after 2 grad");
  expected.sum().backward();
  got.sum().backward();
  for (size_t i = 0; i < plain.weights.size(); ++i) {
    EXPECT_TRUE(remat::testing::bitwise_equal(plain.weights[i].grad(), observed.weights[i].grad())) << i;
  }
  EXPECT_EQ(joined(observed.log), joined(plain.log));
  RecordingChain other(4, "t");
  REMAT_EXPECT_ERROR(remat::run_plan_observed(other, plan, x, observer), "(t0 t1 t2 t3)");
}

TEST(Plan, RecomputesRunTheLastStageOfEachSegmentGraphOnly) {
  torch::manual_seed(0);
  RecordingChain chain(7);
  Plan plan = Plan::unchecked(chain);
  using remat::PlanItem;
  // s0 [s1 s2] [s3 [s4 s5]] s6: the outer segment ends in a nested segment, whose value the
  // outer recompute needs... not at all, but only stages are run graph-only; s2 and s5 are.
  plan.items = {
      PlanItem::run(0), PlanItem::checkpointed({PlanItem::run(1), PlanItem::run(2)}),
      PlanItem::checkpointed({PlanItem::run(3), PlanItem::checkpointed({PlanItem::run(4), PlanItem::run(5)})}),
      PlanItem::run(6)};
  plan.validate_against(chain);
  const at::Tensor x = torch::randn({4}, torch::requires_grad());

  at::Tensor loss = remat::run_plan(chain, plan, x).sum();
  EXPECT_EQ(joined(chain.log), "s0 s1 s2 s3 s4 s5 s6") << "no graph-only stage in the forward";
  chain.log.clear();
  loss.backward();
  // Backward: [s3 [s4 s5]] is recomputed first (its inner segment's forward computes values),
  // then [s4 s5] in that graph's backward, then [s1 s2].
  EXPECT_EQ(joined(chain.log), "s3 s4 s5 s4 s5* s1 s2*");
  std::vector<at::Tensor> checkpointed_grads = {x.grad().clone()};
  for (auto& w : chain.weights) checkpointed_grads.push_back(w.grad().clone());

  // The same gradients as the plain plan's.
  x.mutable_grad().reset();
  for (auto& w : chain.weights) w.mutable_grad().reset();
  remat::run_plan(chain, Plan::unchecked(chain), x).sum().backward();
  EXPECT_TRUE(remat::testing::bitwise_equal(checkpointed_grads[0], x.grad()));
  for (size_t i = 0; i < chain.weights.size(); ++i) {
    EXPECT_TRUE(remat::testing::bitwise_equal(checkpointed_grads[i + 1], chain.weights[i].grad())) << "w" << i;
  }

  // With create_graph the recomputed values may be read by the gradients' graph: none graph-only.
  chain.log.clear();
  at::Tensor again = remat::run_plan(chain, plan, x).sum();
  chain.log.clear();
  const auto grads = torch::autograd::grad({again}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
  EXPECT_EQ(joined(chain.log).find('*'), std::string::npos) << joined(chain.log);
  EXPECT_TRUE(grads[0].requires_grad());
}

// One builder of the plan that checkpoints nothing: from a chain, from a cost table, from a plan.
TEST(Plan, TheUncheckedPlanIsTheSameFromAChainATableOrAnotherPlan) {
  RecordingChain chain(4);
  Plan checkpointed = Plan::unchecked(chain);
  checkpointed.items = {remat::PlanItem::checkpointed({remat::PlanItem::run(0), remat::PlanItem::run(1)}),
                        remat::PlanItem::run(2), remat::PlanItem::run(3)};
  checkpointed.mode = remat::CheckpointMode::non_reentrant;
  const Plan plain = checkpointed.without_checkpoints();
  EXPECT_EQ(plain.to_string(), "s0 s1 s2 s3 (non-reentrant)");
  EXPECT_EQ(plain.stage_names, Plan::unchecked(chain).stage_names);
  remat::CostTable costs;
  costs.granularity = "block";
  for (const auto& name : plain.stage_names) {
    remat::StageCost stage;
    stage.name = name;
    stage.options.emplace_back();
    stage.options.back().option = "full";
    costs.stages.push_back(stage);
  }
  EXPECT_EQ(costs.unchecked_plan(remat::CheckpointMode::non_reentrant).to_json(), plain.to_json());
  REMAT_EXPECT_ERROR(Plan::unchecked("block", {"a", "b"}, {"full"}),
                     "one default option per stage: 2 stages, 1 options");
}

TEST(SequentialChain, RunPlanNeedsItsChainUntilBackwardAndSaysSoWhenItIsGone) {
  nn::Sequential net = mlp(2);
  const at::Tensor x = torch::randn({4, 32});
  std::vector<std::pair<std::string, at::Tensor>> reference;
  {
    remat::SequentialChain chain(net);
    torch::manual_seed(1);
    remat::run_plan(chain, remat::policy_plan("block", chain), x).sum().backward();
    reference = remat::testing::parameter_grads(*net);
  }
  // Made in a function that returns the loss, the chain is gone by backward.
  net->zero_grad();
  at::Tensor orphaned;
  {
    remat::SequentialChain chain(net);
    orphaned = remat::run_plan(chain, remat::policy_plan("block", chain), x);
  }
  REMAT_EXPECT_ERROR(orphaned.sum().backward(),
                     "run_plan: the chain was destroyed before backward recomputed its checkpointed segment");
  // Given as a shared_ptr, it is held until then.
  net->zero_grad();
  at::Tensor held;
  {
    auto chain = std::make_shared<remat::SequentialChain>(net);
    torch::manual_seed(1);
    held = remat::run_plan(chain, remat::policy_plan("block", *chain), x);
  }
  held.sum().backward();
  remat::testing::expect_same_grads(reference, remat::testing::parameter_grads(*net));
  REMAT_EXPECT_ERROR(remat::run_plan(std::shared_ptr<remat::Chain>(), remat::Plan(), x), "run_plan: the chain is null");

  // A copy is an object of its own, with a lifetime of its own.
  remat::SequentialChain original(net);
  std::weak_ptr<const void> of_copy;
  {
    remat::SequentialChain copy = original;
    of_copy = copy.lifetime();
    EXPECT_FALSE(of_copy.expired());
  }
  EXPECT_TRUE(of_copy.expired());
  EXPECT_FALSE(original.lifetime().expired());
}

// A stage run with the generic option "sac" outside any segment is a selective checkpoint of its own:
// its recompute, in backward, needs the chain as a segment's does (a Planned module gone before
// backward ran such a plan's recompute on a destroyed chain: "pure virtual method called").
TEST(SequentialChain, RunPlanHoldsItsChainForAStageRunWithTheGenericSelectiveOption) {
  nn::Sequential net = mlp(2);
  const at::Tensor x = torch::randn({4, 32}, torch::requires_grad());
  auto sac_plan = [](const remat::Chain& chain) {
    Plan plan = Plan::unchecked(chain);
    plan.mode = remat::CheckpointMode::non_reentrant;
    for (auto& option : plan.options) option = remat::kSacOption;
    return plan;
  };
  std::vector<std::pair<std::string, at::Tensor>> reference;
  {
    remat::SequentialChain chain(net);
    torch::manual_seed(1);
    remat::run_plan(chain, Plan::unchecked(chain), x).sum().backward();
    reference = remat::testing::parameter_grads(*net);
  }
  net->zero_grad();
  at::Tensor held;
  {
    auto chain = std::make_shared<remat::SequentialChain>(net);
    torch::manual_seed(1);
    held = remat::run_plan(chain, sac_plan(*chain), x);
  }
  held.sum().backward();
  remat::testing::expect_same_grads(reference, remat::testing::parameter_grads(*net));

  net->zero_grad();
  at::Tensor orphaned;
  {
    remat::SequentialChain chain(net);
    orphaned = remat::run_plan(chain, sac_plan(chain), x);
  }
  REMAT_EXPECT_ERROR(orphaned.sum().backward(), "the chain was destroyed before backward recomputed stage");
}
