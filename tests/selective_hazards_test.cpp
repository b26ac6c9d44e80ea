// Selective checkpointing and the checks of what a recompute reads, tried as a hostile user would
// (issue 39): random calls that take no generator, kept calls that write an argument, a gradient
// penalty through autograd::grad inside the function, policies that compute or misbehave, writes
// made inside the function, captured tensors changed after the forward under default options, and
// "keep everything" on a real block. Every test runs in both modes, against the unchecked run.
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/checkpoint/checkpoint.h"
#include "remat/checkpoint/selective.h"
#include "support/checks.h"
#include "support/compare.h"

using remat::testing::expect_error_containing;

namespace nn = torch::nn;
using remat::CheckpointMode;
using remat::CheckpointOptions;
using remat::CheckpointPolicy;
using remat::testing::bitwise_equal;
using remat::testing::error_of;

namespace {

class SelectiveHazards : public ::testing::TestWithParam<CheckpointMode> {
 protected:
  CheckpointOptions options() const { return CheckpointOptions().mode(GetParam()); }
  CheckpointOptions with(remat::SelectivePolicy policy) const { return options().selective(std::move(policy)); }
  bool reentrant() const { return GetParam() == CheckpointMode::reentrant; }
};

CheckpointPolicy keep_all(const remat::OperatorCall&) { return CheckpointPolicy::prefer_save; }

using Fn = std::function<at::Tensor(const at::Tensor&)>;

// The input's gradient of sum(fn(x)²), seeded, plain or checkpointed.
at::Tensor input_grad(const at::Tensor& x, const Fn& fn, const c10::optional<CheckpointOptions>& options) {
  at::Tensor leaf = x.detach().clone().requires_grad_(true);
  torch::manual_seed(11);
  at::Tensor out = options ? remat::checkpoint(fn, leaf, *options) : fn(leaf);
  out.pow(2).sum().backward();
  return leaf.grad();
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Modes, SelectiveHazards,
                         ::testing::Values(CheckpointMode::reentrant, CheckpointMode::non_reentrant),
                         remat::testing::checkpoint_mode_name);

// ---------------------------------------------------------------------------------------------
// Random calls that take no generator argument draw from the default one: kept, they must leave
// the RNG where the forward did, or every later dropout draws other masks.

TEST_P(SelectiveHazards, KeptRandomCallsWithoutAGeneratorLeaveTheLaterDropoutMasksAlone) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({8, 16});
  const std::vector<std::pair<std::string, Fn>> draws = {
      {"aten::rand_like", [](const at::Tensor& v) { return v * torch::rand_like(v); }},
      {"aten::randn_like", [](const at::Tensor& v) { return v + torch::randn_like(v); }},
      {"aten::rand", [](const at::Tensor& v) { return v * torch::rand(v.sizes()); }},
      {"aten::randn", [](const at::Tensor& v) { return v - torch::randn(v.sizes()); }},
      {"aten::randint_like", [](const at::Tensor& v) { return v * torch::randint_like(v, 5); }},
      {"aten::randint", [](const at::Tensor& v) { return v * torch::randint(5, v.sizes()); }},
      {"aten::randperm", [](const at::Tensor& v) { return v.index_select(1, torch::randperm(v.size(1))); }},
  };
  for (const auto& [name, draw] : draws) {
    for (const bool only_it : {true, false}) {
      SCOPED_TRACE(name + (only_it ? " kept alone" : " under keep-all"));
      Fn fn = [draw = draw](const at::Tensor& v) { return torch::dropout(draw(v).sin(), 0.5, true).cos(); };
      remat::SelectivePolicy policy = only_it ? remat::save_operators({name}) : remat::SelectivePolicy(keep_all);
      EXPECT_TRUE(bitwise_equal(input_grad(x, fn, c10::nullopt), input_grad(x, fn, with(policy))));
    }
  }
}

TEST_P(SelectiveHazards, ThePolicySeesRandomCallsByTheirTags) {
  const at::Tensor x = torch::randn({4, 4}, torch::requires_grad());
  std::vector<std::string> random;
  auto spy = [&](const remat::OperatorCall& call) {
    if (call.random) random.emplace_back(call.name);
    return CheckpointPolicy::prefer_recompute;
  };
  remat::checkpoint(
      [](const at::Tensor& v) {
        at::Tensor r = v * torch::rand_like(v);
        return r + torch::randn({4, 4}) + v.sin();
      },
      x, with(spy));
  EXPECT_EQ(random, (std::vector<std::string>{"aten::rand_like", "aten::randn"}));
}

// ---------------------------------------------------------------------------------------------
// Calls that write an argument are never kept: their recompute must write it again.

TEST_P(SelectiveHazards, RreluWithNoiseIsRecomputedNotKept) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({8, 16});
  Fn fn = [](const at::Tensor& v) { return torch::rrelu(v * 2, 0.1, 0.3, /*training=*/true).sin(); };
  EXPECT_TRUE(bitwise_equal(input_grad(x, fn, c10::nullopt), input_grad(x, fn, with(keep_all))));
  EXPECT_TRUE(bitwise_equal(input_grad(x, fn, c10::nullopt),
                            input_grad(x, fn, with(remat::save_operators({"aten::rrelu_with_noise"})))));
}

TEST_P(SelectiveHazards, MustSaveOnACallThatWritesAnArgumentIsRefusedNamingIt) {
  const at::Tensor x = torch::randn({4, 4}, torch::requires_grad());
  auto must = [](const remat::OperatorCall& call) {
    return call.name == "aten::add" ? CheckpointPolicy::must_save : CheckpointPolicy::prefer_recompute;
  };
  Fn out_variant = [](const at::Tensor& v) {
    at::Tensor out = torch::empty_like(v);
    at::add_out(out, v.detach(), v.detach());
    return v * out;
  };
  expect_error_containing([&] { remat::checkpoint(out_variant, x, with(must).name("out=")); },
                          {"checkpoint 'out=': the selective policy returned must_save for aten::add.out",
                           "writes its argument 'out' in place", "prefer_save"});
  // prefer_save on every call: the out= call runs again, the gradients are the plain run's.
  EXPECT_TRUE(bitwise_equal(input_grad(x, out_variant, c10::nullopt), input_grad(x, out_variant, with(keep_all))));
}

TEST_P(SelectiveHazards, AFakeQuantizeCallThatUpdatesItsObserverIsNotKept) {
  // Its running minimum, maximum, scale and zero point are written in place (Tensor(a!)).
  Fn fake_quantized = [](const at::Tensor& v) {
    at::Tensor on = torch::ones({1}, torch::kLong);
    at::Tensor low = torch::full({1}, -1.0), high = torch::full({1}, 1.0);
    at::Tensor scale = torch::ones({1}), zero_point = torch::zeros({1}, torch::kInt);
    return at::fused_moving_avg_obs_fake_quant(v * 2, on, on, low, high, scale, zero_point, 0.01, 0, 255, 0).sin();
  };
  const at::Tensor x = torch::randn({4, 4});
  EXPECT_TRUE(
      bitwise_equal(input_grad(x, fake_quantized, c10::nullopt), input_grad(x, fake_quantized, with(keep_all))));
  auto must = [](const remat::OperatorCall&) { return CheckpointPolicy::must_save; };
  const at::Tensor leaf = x.clone().requires_grad_(true);
  expect_error_containing([&] { remat::checkpoint(fake_quantized, leaf, with(must).name("fq")); },
                          {"checkpoint 'fq': the selective policy returned must_save for aten::",
                           "writes its argument 'running_min' in place"});
}

// ---------------------------------------------------------------------------------------------
// "Keep everything" on a real block: views are recomputed (they cost nothing), the rest kept.

TEST_P(SelectiveHazards, MustSaveOnEveryCallRunsARealBlock) {
  torch::manual_seed(0);
  nn::Linear fc1(16, 32), fc2(32, 16);
  nn::LayerNorm norm(nn::LayerNormOptions({16}));
  Fn block = [&](const at::Tensor& v) {
    at::Tensor h = norm(v).view({-1, 16});
    h = torch::gelu(fc1(h)).unsqueeze(0).squeeze(0).t().contiguous();
    h = h.t().contiguous();
    return v + fc2(h).view(v.sizes());
  };
  auto must = [](const remat::OperatorCall&) { return CheckpointPolicy::must_save; };
  const at::Tensor x = torch::randn({4, 5, 16});
  EXPECT_TRUE(bitwise_equal(input_grad(x, block, c10::nullopt), input_grad(x, block, with(must))));
}

// ---------------------------------------------------------------------------------------------
// A gradient penalty: autograd::grad inside the checkpointed function.

TEST_P(SelectiveHazards, AGradientPenaltyInsideTheFunctionGivesThePlainGradients) {
  torch::manual_seed(0);
  const at::Tensor w = torch::randn({16, 16}, torch::requires_grad());
  Fn penalised = [&](const at::Tensor& v) {
    at::Tensor y = torch::tanh(v.mm(w));
    at::Tensor g = torch::autograd::grad({y.sum()}, {v}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    return y + g.pow(2).sum(1, /*keepdim=*/true);
  };
  const at::Tensor x = torch::randn({8, 16});
  auto grads = [&](const c10::optional<CheckpointOptions>& options) {
    w.mutable_grad() = at::Tensor();
    at::Tensor input = input_grad(x, penalised, options);
    return std::make_pair(input, w.grad().clone());
  };
  const auto plain = grads(c10::nullopt);
  if (reentrant()) {
    expect_error_containing([&] { grads(options().name("penalty")); },
                            {"checkpoint 'penalty'", "autograd::grad", "use_reentrant(false)"});
    return;
  }
  for (const auto& options : {this->options(), with(remat::save_compute_intensive())}) {
    const auto checked = grads(options);
    EXPECT_TRUE(bitwise_equal(plain.first, checked.first));
    EXPECT_TRUE(bitwise_equal(plain.second, checked.second));
  }
}

TEST_P(SelectiveHazards, ABackwardOfAnInnerGraphInsideTheFunctionRuns) {
  // The function fits a scale by one gradient step of its own (a graph apart from its output's).
  torch::manual_seed(0);
  Fn fitted = [](const at::Tensor& v) {
    at::Tensor scale = torch::ones({1}, torch::requires_grad());
    (v.detach() * scale - 1).pow(2).sum().backward();
    return v.sin() * (scale - 0.1 * scale.grad()).detach();
  };
  const at::Tensor x = torch::randn({8, 16});
  if (reentrant()) {
    const at::Tensor leaf = x.clone().requires_grad_(true);
    expect_error_containing([&] { remat::checkpoint(fitted, leaf, options().name("fit")); },
                            {"checkpoint 'fit'", "use_reentrant(false)"});
    return;
  }
  EXPECT_TRUE(bitwise_equal(input_grad(x, fitted, c10::nullopt), input_grad(x, fitted, options())));
}

// ---------------------------------------------------------------------------------------------
// Policies are user code: their tensor operations are their own, a checkpoint in one is refused,
// their exceptions reach the user with the call named, and their answers are checked.

TEST_P(SelectiveHazards, APolicyMayComputeWithTensors) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({8, 16});
  int64_t asked = 0;
  auto computing = [&](const remat::OperatorCall& call) {
    ++asked;
    at::Tensor total = torch::ones({2}).sum();
    if (!call.arguments.empty() && call.arguments[0].isTensor()) total = total + call.arguments[0].toTensor().sum();
    return call.name == "aten::mm" ? CheckpointPolicy::prefer_save : CheckpointPolicy::prefer_recompute;
  };
  Fn fn = [](const at::Tensor& v) { return v.mm(v.t()).sin().mm(v); };
  EXPECT_TRUE(bitwise_equal(input_grad(x, fn, c10::nullopt), input_grad(x, fn, with(computing))));
  EXPECT_GT(asked, 0);
}

TEST_P(SelectiveHazards, ACheckpointInsideAPolicyIsRefused) {
  const at::Tensor x = torch::randn({4, 4}, torch::requires_grad());
  auto nesting = [](const remat::OperatorCall& call) {
    if (!call.arguments.empty() && call.arguments[0].isTensor()) {
      const at::Tensor t = call.arguments[0].toTensor().detach().requires_grad_(true);
      remat::checkpoint([](const at::Tensor& v) { return v * 2; }, t, CheckpointOptions().name("in policy"));
    }
    return CheckpointPolicy::prefer_recompute;
  };
  expect_error_containing([&] { remat::checkpoint([](const at::Tensor& v) { return v.sin(); }, x, with(nesting)); },
                          {"checkpoint 'in policy': called from inside a selective policy"});
  at::Tensor y = remat::checkpoint([](const at::Tensor& v) { return v.sin(); }, x, options());
  y.sum().backward();  // the thread is clean after the refusal
  EXPECT_TRUE(bitwise_equal(x.grad(), x.cos()));
}

TEST_P(SelectiveHazards, APolicysErrorNamesTheCallAndABadAnswerIsRefused) {
  const at::Tensor x = torch::randn({4, 4}, torch::requires_grad());
  auto throwing = [](const remat::OperatorCall& call) -> CheckpointPolicy {
    if (call.name == "aten::cos") throw std::runtime_error("no cosines here");
    return CheckpointPolicy::prefer_recompute;
  };
  expect_error_containing(
      [&] { remat::checkpoint([](const at::Tensor& v) { return v.sin().cos(); }, x, with(throwing).name("p")); },
      {"checkpoint 'p': the selective policy threw while deciding aten::cos (operator call 1): no cosines here"});
  auto bad = [](const remat::OperatorCall&) { return static_cast<CheckpointPolicy>(42); };
  expect_error_containing([&] { remat::checkpoint([](const at::Tensor& v) { return v.sin(); }, x, with(bad)); },
                          {"returned CheckpointPolicy(42) for aten::sin", "must_save, prefer_save"});
}

TEST(SelectivePolicyNames, SaveOperatorsRefusesNamesNoOperatorHas) {
  expect_error_containing(
      [] {
        remat::save_operators({"aten::mm", "aten::no_such_op"});
      },
      {"save_operators: no operator is named 'aten::no_such_op'"});
  expect_error_containing([] { remat::save_operators({"aten::add.NoSuchOverload"}); },
                          {"no operator is named 'aten::add.NoSuchOverload'"});
  remat::save_operators({"aten::mm", "aten::add.Tensor", "aten::native_dropout"});
}

// ---------------------------------------------------------------------------------------------
// What the function reads from outside it: checked by default, also without a policy.

TEST_P(SelectiveHazards, AWriteInsideTheFunctionToACapturedTensorItThenReadsIsRefused) {
  for (const bool no_grad : {false, true}) {
    SCOPED_TRACE(no_grad);
    at::Tensor w = torch::randn({4, 4});
    const at::Tensor x = torch::randn({4, 4}, torch::requires_grad());
    Fn fn = [&](const at::Tensor& v) {
      if (no_grad) {
        torch::NoGradGuard guard;
        w.add_(1);
      } else {
        w.add_(1);
      }
      return v.mm(w);
    };
    expect_error_containing(
        [&] { remat::checkpoint(fn, x, options().name("writes w")); },
        {"checkpoint 'writes w': the function changes a Float[4, 4] on cpu tensor from outside it in place",
         "then reads it (aten::mm", "w.clone().add_(1)"});
  }
}

TEST_P(SelectiveHazards, ACapturedTensorChangedAfterTheForwardIsRefusedByDefault) {
  at::Tensor w = torch::randn({4, 4});
  const at::Tensor x = torch::randn({4, 4}, torch::requires_grad());
  at::Tensor y = remat::checkpoint([&](const at::Tensor& v) { return (v + w).tanh(); }, x, options().name("default"));
  w.add_(1);
  expect_error_containing([&] { y.sum().backward(); }, {"checkpoint 'default'", "modified in place after the forward"});
  // And rebound.
  at::Tensor u = torch::randn({4, 4});
  at::Tensor z = remat::checkpoint([&](const at::Tensor& v) { return (v * u).tanh(); }, x, options().name("rebound"));
  u = u + 1;
  expect_error_containing([&] { z.sum().backward(); }, {"checkpoint 'rebound'", "w = w + 1"});
  // The opt-out is one option away.
  at::Tensor s = torch::randn({4, 4});
  at::Tensor q =
      remat::checkpoint([&](const at::Tensor& v) { return (v + s).tanh(); }, x, options().check_reads(false));
  s.add_(1);
  EXPECT_NO_THROW(q.sum().backward());
}

// BatchNorm's running statistics, written inside the function, are updated once per step without
// being listed in restore_after_recompute.
TEST_P(SelectiveHazards, BufferWritesInsideTheFunctionHappenOnceWithoutBeingListed) {
  // oneDNN's convolutions differ run to run on some CPUs (LibTorch 2.6, AVX-512): not remat's.
  const bool mkldnn = at::globalContext().userEnabledMkldnn();
  at::globalContext().setUserEnabledMkldnn(false);
  struct Restore {
    bool on;
    ~Restore() { at::globalContext().setUserEnabledMkldnn(on); }
  } restore{mkldnn};
  torch::manual_seed(0);
  nn::Sequential plain(nn::Conv2d(nn::Conv2dOptions(3, 4, 3).padding(1)), nn::BatchNorm2d(4), nn::ReLU());
  nn::Sequential checked(nn::Conv2d(nn::Conv2dOptions(3, 4, 3).padding(1)), nn::BatchNorm2d(4), nn::ReLU());
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < plain->parameters().size(); ++i) checked->parameters()[i].copy_(plain->parameters()[i]);
  }
  const at::Tensor x = torch::randn({2, 3, 8, 8});
  for (int step = 0; step < 3; ++step) {
    plain->forward(x).pow(2).sum().backward();
    remat::checkpoint([&](const at::Tensor& v) { return checked->forward(v); }, x.requires_grad_(false), options())
        .pow(2)
        .sum()
        .backward();
  }
  const auto expected = plain->buffers(), got = checked->buffers();
  ASSERT_EQ(expected.size(), got.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_TRUE(bitwise_equal(expected[i], got[i])) << "buffer " << i;
}

// ---------------------------------------------------------------------------------------------
// Where the reentrant mode is not bitwise (docs/library.md says so): a tensor used inside and
// outside one checkpoint, or in two, gets its gradient summed in another order (the reentrant
// node sums its own uses first). The non-reentrant mode leaves the order to autograd: bitwise.

TEST_P(SelectiveHazards, AWeightSharedByTwoCheckpointsGetsThePlainGradient) {
  torch::manual_seed(0);
  const at::Tensor w = torch::randn({16, 16}, torch::requires_grad());
  const at::Tensor x = torch::randn({8, 16});
  Fn twice = [&](const at::Tensor& v) { return torch::tanh(v.mm(w)).mm(w).sin(); };
  auto grad_of = [&](bool checkpointed) {
    at::Tensor h = checkpointed ? remat::checkpoint(twice, x, options()) : twice(x);
    h = checkpointed ? remat::checkpoint(twice, h, options()) : twice(h);
    return torch::autograd::grad({h.pow(2).sum()}, {w})[0];
  };
  const at::Tensor plain = grad_of(false), checked = grad_of(true);
  if (reentrant()) {
    EXPECT_TRUE(torch::allclose(plain, checked, 1e-5, 1e-6));
  } else {
    EXPECT_TRUE(bitwise_equal(plain, checked));
  }
}

TEST_P(SelectiveHazards, SecondDerivativesMatchThePlainRun) {
  torch::manual_seed(0);
  const at::Tensor w = torch::randn({16, 16}, torch::requires_grad());
  const at::Tensor x0 = torch::randn({8, 16});
  Fn fn = [&](const at::Tensor& v) { return torch::tanh(v.mm(w)).pow(2); };
  auto second = [&](const c10::optional<CheckpointOptions>& options) {
    at::Tensor x = x0.clone().requires_grad_(true);
    at::Tensor y = options ? remat::checkpoint(fn, x, *options) : fn(x);
    at::Tensor g = torch::autograd::grad({y.sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    return torch::autograd::grad({g.pow(2).sum()}, {x, w});
  };
  const auto plain = second(c10::nullopt);
  for (const auto& options : {this->options(), with(remat::save_compute_intensive())}) {
    const auto checked = second(options);
    for (size_t i = 0; i < plain.size(); ++i) {
      if (reentrant()) {
        EXPECT_TRUE(torch::allclose(plain[i], checked[i], 1e-5, 1e-6)) << i;
      } else {
        EXPECT_TRUE(bitwise_equal(plain[i], checked[i])) << i;
      }
    }
  }
}
