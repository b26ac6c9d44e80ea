// remat/checkpoint/checkpoint.h: the checkpoint mechanism: gradients, parameters, RNG, autocast, nesting, errors, in
// both modes (one suite, run reentrant and non-reentrant), then what only the non-reentrant mode does.
#include <atomic>
#include <functional>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "checkpoint/forward_state.h"
#include "remat/checkpoint/checkpoint.h"
#include "remat/memory/memory.h"
#include "support/checks.h"
#include "support/compare.h"

using remat::testing::expect_error_containing;

using remat::testing::bitwise_equal;

namespace {

// Runs `fn` on a fresh leaf copy of `x`, plainly or checkpointed, backpropagates sum(out²), and
// returns the input gradient.
at::Tensor input_grad(const remat::TensorFunction& fn, const at::Tensor& x, bool checkpointed) {
  at::Tensor leaf = x.detach().clone().requires_grad_(true);
  at::Tensor out = checkpointed ? remat::checkpoint(fn, leaf) : fn(leaf);
  out.pow(2).sum().backward();
  return leaf.grad();
}

// Every test of the suite runs in both modes: checkpoint calls take the guard's default.
class Checkpoint : public ::testing::TestWithParam<remat::CheckpointMode> {
 protected:
  bool reentrant() const { return GetParam() == remat::CheckpointMode::reentrant; }

 private:
  remat::CheckpointModeGuard mode_{GetParam()};
};

}  // namespace

INSTANTIATE_TEST_SUITE_P(Modes, Checkpoint,
                         ::testing::Values(remat::CheckpointMode::reentrant, remat::CheckpointMode::non_reentrant),
                         remat::testing::checkpoint_mode_name);

TEST_P(Checkpoint, InputAndParameterGradientsEqualThePlainRun) {
  torch::manual_seed(0);
  torch::nn::Linear linear(16, 16);
  auto fn = [&](const at::Tensor& x) { return linear(x.sin()).tanh() * x; };
  at::Tensor x = torch::randn({4, 16});

  at::Tensor plain_input_grad = input_grad(fn, x, false);
  auto plain = remat::testing::parameter_grads(*linear);
  linear->zero_grad();
  at::Tensor checkpointed_input_grad = input_grad(fn, x, true);

  EXPECT_TRUE(bitwise_equal(plain_input_grad, checkpointed_input_grad));
  remat::testing::expect_same_grads(plain, remat::testing::parameter_grads(*linear));
}

TEST_P(Checkpoint, ParametersGetGradientsWhenNoInputRequiresGrad) {
  torch::manual_seed(0);
  torch::nn::Linear adapter(8, 8);
  at::Tensor frozen_embedding = torch::randn({3, 8});  // requires_grad = false
  auto fn = [&](const at::Tensor& x) { return adapter(x).relu(); };

  fn(frozen_embedding).sum().backward();
  auto plain = remat::testing::parameter_grads(*adapter);
  adapter->zero_grad();

  at::Tensor out = remat::checkpoint(fn, frozen_embedding);
  ASSERT_TRUE(out.requires_grad());
  out.sum().backward();
  remat::testing::expect_same_grads(plain, remat::testing::parameter_grads(*adapter));
}

TEST_P(Checkpoint, WorksWithAutogradGrad) {
  torch::manual_seed(0);
  at::Tensor w = torch::randn({5, 5}, torch::requires_grad());
  at::Tensor x = torch::randn({2, 5}, torch::requires_grad());
  auto fn = [&](const at::Tensor& in) { return in.mm(w).sigmoid(); };

  auto plain = torch::autograd::grad({fn(x).sum()}, {x, w});
  auto checkpointed = torch::autograd::grad({remat::checkpoint(fn, x).sum()}, {x, w});
  EXPECT_TRUE(bitwise_equal(plain[0], checkpointed[0]));
  EXPECT_TRUE(bitwise_equal(plain[1], checkpointed[1]));
  EXPECT_FALSE(w.grad().defined()) << "autograd::grad must not accumulate into .grad";
}

TEST_P(Checkpoint, ParameterHookFiresOncePerBackward) {
  at::Tensor w = torch::randn({4, 4}, torch::requires_grad());
  int calls = 0;
  w.register_hook([&calls](const at::Tensor& g) {
    ++calls;
    return g;
  });
  at::Tensor x = torch::randn({3, 4});
  remat::checkpoint([&](const at::Tensor& in) { return in.mm(w).exp(); }, x).sum().backward();
  EXPECT_EQ(calls, 1);
}

// LibTorch 2.x fires a leaf's hooks when a gradient is captured for it (torch_compat.h): a hook
// that changes the gradient must still apply once, as in the plain run, also under autograd::grad
// and for a checkpoint nested in another.
TEST_P(Checkpoint, GradientChangingHooksApplyOnceAsInThePlainRun) {
  at::Tensor w = torch::randn({4, 4}, torch::requires_grad());
  int calls = 0;
  w.register_hook([&calls](const at::Tensor& g) {
    ++calls;
    return g * 3;
  });
  at::Tensor x = torch::randn({3, 4}, torch::requires_grad());
  auto inner = [&](const at::Tensor& in) { return in.mm(w).tanh(); };
  auto fn = [&](const at::Tensor& in) { return inner(in).mm(w).exp(); };
  auto nested = [&](const at::Tensor& in) { return remat::checkpoint(inner, in).mm(w).exp(); };

  // Under grad, 1.13 fires no leaf hook and 2.x fires it at the capture: the plain run says which.
  const auto plain = torch::autograd::grad({fn(x).sum()}, {w, x});
  const int plain_grad_calls = calls;
  calls = 0;
  fn(x).sum().backward();
  ASSERT_EQ(calls, 1);
  const at::Tensor plain_accumulated = w.grad().clone();
  for (const auto& [name, f] : {std::pair<const char*, remat::TensorFunction>{"flat", fn}, {"nested", nested}}) {
    calls = 0;
    const auto checkpointed = torch::autograd::grad({remat::checkpoint(f, x).sum()}, {w, x});
    EXPECT_EQ(calls, plain_grad_calls) << name;
    EXPECT_TRUE(torch::allclose(plain[0], checkpointed[0], 1e-5, 1e-6)) << name;
    EXPECT_TRUE(torch::allclose(plain[1], checkpointed[1], 1e-5, 1e-6)) << name;
    calls = 0;
    w.mutable_grad() = at::Tensor();
    remat::checkpoint(f, x).sum().backward();
    EXPECT_EQ(calls, 1) << name;
    EXPECT_TRUE(torch::allclose(plain_accumulated, w.grad(), 1e-5, 1e-6)) << name;
  }
}

TEST_P(Checkpoint, DropoutMasksAndRngStreamAreThoseOfThePlainRun) {
  torch::nn::Linear linear(32, 32);
  auto fn = [&](const at::Tensor& x) { return torch::dropout(linear(x), 0.5, /*train=*/true); };
  at::Tensor x = torch::randn({8, 32});

  torch::manual_seed(123);
  at::Tensor plain_grad = input_grad(fn, x, false);
  at::Tensor plain_next = torch::rand({4});

  torch::manual_seed(123);
  at::Tensor checkpointed_grad = input_grad(fn, x, true);
  at::Tensor checkpointed_next = torch::rand({4});

  EXPECT_TRUE(bitwise_equal(plain_grad, checkpointed_grad));
  EXPECT_TRUE(bitwise_equal(plain_next, checkpointed_next)) << "the recompute disturbed the RNG stream";
}

TEST_P(Checkpoint, WithoutRngPreservationDropoutMasksDiffer) {
  torch::nn::Linear linear(32, 32);
  auto fn = [&](const at::Tensor& x) { return torch::dropout(linear(x), 0.5, /*train=*/true); };
  at::Tensor x = torch::randn({8, 32});
  torch::manual_seed(123);
  at::Tensor plain_grad = input_grad(fn, x, false);

  torch::manual_seed(123);
  at::Tensor leaf = x.clone().requires_grad_(true);
  remat::checkpoint(fn, leaf, remat::CheckpointOptions().preserve_rng_state(false)).pow(2).sum().backward();
  EXPECT_FALSE(plain_grad.equal(leaf.grad()));
}

TEST_P(Checkpoint, AutocastAndGradModeOfTheForwardAreReappliedInTheRecompute) {
  at::Tensor w = torch::randn({8, 8}, torch::requires_grad());
  std::vector<at::ScalarType> matmul_dtypes;
  std::vector<bool> grad_modes;
  auto fn = [&](const at::Tensor& x) {
    at::Tensor y = x.mm(w);
    matmul_dtypes.push_back(y.scalar_type());
    grad_modes.push_back(c10::GradMode::is_enabled());
    return y.to(at::kFloat).relu();
  };
  at::Tensor x = torch::randn({4, 8});
  remat::detail::AutocastSnapshot bf16;
  bf16.cpu_enabled = true;
  bf16.cpu_dtype = at::kBFloat16;
  at::Tensor out;
  {
    remat::detail::AutocastScope autocast(bf16);
    out = remat::checkpoint(fn, x);
  }
  out.sum().backward();  // autocast is off here; the recompute must turn it on again
  ASSERT_EQ(matmul_dtypes.size(), 2u);
  EXPECT_EQ(matmul_dtypes[0], at::kBFloat16);
  EXPECT_EQ(matmul_dtypes[1], at::kBFloat16);
  EXPECT_TRUE(grad_modes[1]) << "the recompute must record a graph";
  EXPECT_FALSE(remat::detail::AutocastSnapshot::capture().cpu_enabled) << "autocast leaked out of the recompute";
}

TEST_P(Checkpoint, NestedCheckpointsGiveThePlainGradients) {
  torch::manual_seed(0);
  torch::nn::Linear a(6, 6), b(6, 6);
  auto inner = [&](const at::Tensor& x) { return b(x).tanh(); };
  auto plain = [&](const at::Tensor& x) { return inner(a(x).sin()) + x; };
  auto nested = [&](const at::Tensor& x) { return remat::checkpoint(inner, a(x).sin()) + x; };
  at::Tensor x = torch::randn({3, 6});

  at::Tensor plain_grad = input_grad(plain, x, false);
  auto plain_params = remat::testing::parameter_grads(*a);
  auto plain_params_b = remat::testing::parameter_grads(*b);
  a->zero_grad();
  b->zero_grad();
  at::Tensor nested_grad = input_grad(nested, x, true);
  EXPECT_TRUE(bitwise_equal(plain_grad, nested_grad));
  remat::testing::expect_same_grads(plain_params, remat::testing::parameter_grads(*a));
  remat::testing::expect_same_grads(plain_params_b, remat::testing::parameter_grads(*b));
}

TEST_P(Checkpoint, UnderNoGradRunsOnceAndKeepsNothing) {
  int calls = 0;
  at::Tensor w = torch::randn({4, 4}, torch::requires_grad());
  torch::NoGradGuard no_grad;
  at::Tensor out = remat::checkpoint(
      [&](const at::Tensor& x) {
        ++calls;
        return x.mm(w);
      },
      torch::randn({2, 4}));
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(out.requires_grad());
}

TEST_P(Checkpoint, MultipleOutputsSomeIntegerSomeUnusedSomeUndefined) {
  torch::manual_seed(0);
  at::Tensor w = torch::randn({5, 5}, torch::requires_grad());
  auto fn = [&](const std::vector<at::Tensor>& in) {
    at::Tensor h = in[0].mm(w);
    return std::vector<at::Tensor>{h.tanh(), h.argmax(1), h.exp(), at::Tensor()};
  };
  at::Tensor x = torch::randn({3, 5}, torch::requires_grad());

  auto plain_out = fn({x});
  plain_out[0].sum().backward();
  at::Tensor plain_x = x.grad().clone(), plain_w = w.grad().clone();
  x.mutable_grad().reset();
  w.mutable_grad().reset();

  auto outs = remat::checkpoint(fn, {x});
  ASSERT_EQ(outs.size(), 4u);
  EXPECT_EQ(outs[1].scalar_type(), at::kLong);
  EXPECT_FALSE(outs[1].requires_grad());
  EXPECT_FALSE(outs[3].defined());
  EXPECT_TRUE(outs[2].requires_grad());
  outs[0].sum().backward();  // outs[2] is unused in the loss
  EXPECT_TRUE(bitwise_equal(plain_x, x.grad()));
  EXPECT_TRUE(bitwise_equal(plain_w, w.grad()));
}

TEST_P(Checkpoint, InputsWithoutGradUndefinedInputsAndCapturedNonTensors) {
  at::Tensor x = torch::randn({4}, torch::requires_grad());
  at::Tensor mask = torch::ones({4});  // does not require grad
  const double scale = 3.0;
  const int power = 2;
  std::vector<bool> saw_undefined;
  auto fn = [&](const std::vector<at::Tensor>& in) {
    saw_undefined.push_back(!in[1].defined());
    EXPECT_FALSE(in[2].requires_grad());
    return std::vector<at::Tensor>{in[0].pow(power) * in[2] * scale};
  };
  auto outs = remat::checkpoint(fn, {x, at::Tensor(), mask});
  outs[0].sum().backward();
  EXPECT_EQ(saw_undefined, (std::vector<bool>{true, true}));
  EXPECT_TRUE(x.grad().allclose(2 * scale * x.detach()));
  EXPECT_FALSE(mask.grad().defined());
}

TEST_P(Checkpoint, NondeterministicShapeFailsInBackwardNamingTheFunction) {
  int calls = 0;
  at::Tensor x = torch::randn({6}, torch::requires_grad());
  at::Tensor out = remat::checkpoint(
      [&](const at::Tensor& in) { return ++calls == 1 ? (in * 2).exp() : (in.narrow(0, 0, 3) * 2).exp(); }, x,
      remat::CheckpointOptions().name("flaky").check_reads(false));
  // Reentrant checks the recompute's outputs, non-reentrant every tensor it saves (exp's output).
  expect_error_containing(
      [&] { out.sum().backward(); },
      {"checkpoint 'flaky'", reentrant() ? "output 0" : "saved tensor 0", "[3]", "[6]", "must compute the same"});
  // By default the operator calls are checked first, one by one.
  calls = 0;
  at::Tensor checked = remat::checkpoint(
      [&](const at::Tensor& in) { return ++calls == 1 ? (in * 2).exp() : (in.narrow(0, 0, 3) * 2).exp(); }, x,
      remat::CheckpointOptions().name("flaky"));
  expect_error_containing([&] { checked.sum().backward(); },
                          {"checkpoint 'flaky': the recompute's operator call 0 is aten::slice.Tensor but the "
                           "forward's was aten::mul.Scalar"});
}

TEST_P(Checkpoint, NondeterministicDtypeFailsInBackward) {
  int calls = 0;
  at::Tensor x = torch::randn({6}, torch::requires_grad());
  at::Tensor out = remat::checkpoint(
      [&](const at::Tensor& in) { return ++calls == 1 ? (in * 2).exp() : (in * 2).to(at::kDouble).exp(); }, x,
      remat::CheckpointOptions().name("dtype-changer").check_reads(false));
  expect_error_containing([&] { out.sum().backward(); }, {"checkpoint 'dtype-changer'", "Double", "Float"});
}

TEST_P(Checkpoint, BackwardTwiceNeedsRetainGraph) {
  at::Tensor x = torch::randn({3}, torch::requires_grad());
  auto fn = [](const at::Tensor& in) { return in.exp(); };
  at::Tensor loss = remat::checkpoint(fn, x).sum();
  loss.backward({}, /*retain_graph=*/true);
  at::Tensor once = x.grad().clone();
  loss.backward();
  EXPECT_TRUE(x.grad().allclose(2 * once));
  expect_error_containing([&] { loss.backward(); }, {"backward through the graph a second time"});
}

TEST_P(Checkpoint, SavedInputsAndRecomputedGraphAreFreedAfterBackward) {
  remat::install_cpu_memory_tracker();
  at::Tensor x = torch::randn({256, 256}, torch::requires_grad());
  at::Tensor w = torch::randn({256, 256}, torch::requires_grad());
  const int64_t before = remat::memory_stats().current_bytes;
  at::Tensor hidden = x * 2;  // an activation held only by the checkpoint once `hidden` is reset
  at::Tensor out = remat::checkpoint([&](const at::Tensor& h) { return h.mm(w).tanh().mm(w); }, hidden);
  hidden.reset();
  at::Tensor loss = out.sum();
  loss.backward();
  // Nothing of the checkpoint is left: its saved input and RNG state went with the backward.
  const int64_t expected = out.nbytes() + loss.nbytes() + x.grad().nbytes() + w.grad().nbytes();
  EXPECT_EQ(remat::memory_stats().current_bytes - before, expected);
}

// The recomputed output is the root of the segment's backward, but no backward node needs its
// data: it is released before the engine runs. So the backward holds the incoming gradient and the
// input's gradient (2N), not the recomputed output as well (3N); the forward holds 2N too (its
// output and the loss's product).
TEST_P(Checkpoint, RecomputedOutputIsNotHeldThroughTheSegmentsBackward) {
  remat::install_cpu_memory_tracker();
  constexpr int64_t n = 1 << 16;
  constexpr int64_t bytes = n * 4;
  at::Tensor x = torch::randn({n}, torch::requires_grad());
  at::Tensor w = torch::randn({n});
  auto twice = [](const at::Tensor& in) { return in * 2; };  // saves nothing for backward
  const auto m = remat::measure_step([&] { return (remat::checkpoint(twice, x) * w).sum(); });
  EXPECT_GE(m.activation_peak_bytes(), 2 * bytes);
  EXPECT_LT(m.activation_peak_bytes(), 2 * bytes + bytes / 2);
  EXPECT_TRUE(remat::testing::bitwise_equal(x.grad(), w * 2));
}

// Double backward: the gradient's graph, built during the recompute's backward, reaches into the
// recomputed graph (tanh's backward reuses tanh's output), so that graph must outlive the first
// backward when create_graph is on.
TEST_P(Checkpoint, DoubleBackwardThroughTheRecomputeGivesThePlainSecondDerivative) {
  at::Tensor x = torch::randn({5}, torch::requires_grad());
  at::Tensor w = torch::randn({5}, torch::requires_grad());
  auto layer = [&](const at::Tensor& in) { return (in * w).tanh(); };
  auto second = [&](bool checkpointed) {
    x.mutable_grad().reset();
    w.mutable_grad().reset();
    at::Tensor h = x * 3;  // a non-leaf input: second derivatives must flow back through its graph
    at::Tensor y = checkpointed ? remat::checkpoint(layer, h) : layer(h);
    at::Tensor dx = torch::autograd::grad({y.sum()}, {x}, {}, /*retain_graph=*/c10::nullopt, /*create_graph=*/true)[0];
    dx.pow(2).sum().backward();
    return std::make_pair(x.grad().clone(), w.grad().clone());
  };
  const auto plain = second(false);
  const auto checked = second(true);
  ASSERT_TRUE(checked.first.defined() && checked.second.defined());
  EXPECT_TRUE(torch::allclose(plain.first, checked.first));
  EXPECT_TRUE(torch::allclose(plain.second, checked.second));
}

// A function may return one of the parameters it uses unchanged: the parameter is then a root of
// the recompute's backward, and still gets its gradient exactly once.
TEST_P(Checkpoint, ReturningAParameterUnchangedGivesItsGradientOnce) {
  at::Tensor x = torch::randn({4}, torch::requires_grad());
  at::Tensor w = torch::randn({4}, torch::requires_grad());
  auto fn = [&](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{w, in[0] * w}; };
  auto grads = [&](bool checkpointed) {
    x.mutable_grad().reset();
    w.mutable_grad().reset();
    auto out = checkpointed ? remat::checkpoint(fn, {x}) : fn({x});
    (out[0].sum() * 3 + out[1].sum()).backward();
    return std::make_pair(x.grad().clone(), w.grad().clone());
  };
  const auto plain = grads(false);
  const auto checked = grads(true);
  EXPECT_TRUE(bitwise_equal(plain.first, checked.first));
  EXPECT_TRUE(bitwise_equal(plain.second, checked.second));
}

TEST_P(Checkpoint, BatchNormStatisticsUpdateOnceWithRestoreAfterRecompute) {
  torch::manual_seed(0);
  at::Tensor x = torch::randn({16, 4}) * 3 + 1;
  auto run = [&](bool checkpointed, bool restore, bool check_reads = false) {
    torch::nn::BatchNorm1d bn(4);
    auto fn = [&](const at::Tensor& in) { return bn(in).relu(); };
    at::Tensor out;
    if (checkpointed) {
      auto options = remat::CheckpointOptions().check_reads(check_reads);
      if (restore) options.restore_after_recompute(bn->buffers());
      out = remat::checkpoint(fn, x, options);
    } else {
      out = fn(x.clone().requires_grad_(true));
    }
    out.sum().backward();
    return std::make_pair(bn->running_mean.clone(), bn->num_batches_tracked.item<int64_t>());
  };
  auto plain = run(false, false);
  auto restored = run(true, true);
  auto twice = run(true, false);
  EXPECT_TRUE(bitwise_equal(plain.first, restored.first));
  EXPECT_EQ(restored.second, 1);
  EXPECT_EQ(twice.second, 2) << "without restore_after_recompute the recompute updates the statistics again";
  // With check_reads (the default) the checkpoint sees the writes and restores them itself.
  auto seen = run(true, false, true);
  EXPECT_TRUE(bitwise_equal(plain.first, seen.first));
  EXPECT_EQ(seen.second, 1);
}

TEST_P(Checkpoint, ErrorsForEmptyInputsAndFunctionsReturningNoTensor) {
  expect_error_containing(
      [] { remat::checkpoint([](const std::vector<at::Tensor>&) { return std::vector<at::Tensor>{}; }, {}); },
      {"remat: checkpoint 'checkpoint'", "inputs is empty"});
  at::Tensor x = torch::randn({2}, torch::requires_grad());
  expect_error_containing(
      [&] {
        remat::checkpoint([](const std::vector<at::Tensor>&) { return std::vector<at::Tensor>{}; }, {x},
                          remat::CheckpointOptions().name("void"));
      },
      {"checkpoint 'void'", "returned no tensor"});
  expect_error_containing([&] { remat::checkpoint([](const at::Tensor&) { return at::Tensor(); }, x); },
                          {"returned no tensor"});
  expect_error_containing([&] { remat::checkpoint(remat::TensorFunction(), x); }, {"function is empty"});
}

TEST_P(Checkpoint, CapturingANonLeafTensorThatRequiresGradIsAnErrorWhereReentrant) {
  at::Tensor x = torch::randn({3}, torch::requires_grad());
  at::Tensor computed_outside = x.exp();
  auto fn = [&](const at::Tensor& in) { return in * computed_outside; };
  if (reentrant()) {
    expect_error_containing([&] { remat::checkpoint(fn, x); },
                            {"computed outside it", "Pass that tensor in the checkpoint's inputs"});
    return;
  }
  // Non-reentrant: the forward's own graph reaches it; its gradient flows as without checkpoint.
  remat::checkpoint(fn, x).sum().backward();
  EXPECT_TRUE(x.grad().allclose(computed_outside.detach() + x.detach() * computed_outside.detach()));
}

// An in-place change, between forward and backward, to a tensor the function saved: the plain run
// refuses it ("modified by an inplace operation"), so a checkpoint must too, before its recompute
// reads the new values. `change` runs between the two.
static void expect_in_place_change_refused(const remat::TensorFunction& fn, const at::Tensor& x,
                                           const std::function<void()>& change, const std::string& described) {
  at::Tensor plain = fn(x);
  change();
  expect_error_containing([&] { plain.sum().backward(); }, {"modified by an inplace operation"});
  at::Tensor checkpointed = remat::checkpoint(fn, x, remat::CheckpointOptions().name("block7"));
  change();
  expect_error_containing([&] { checkpointed.sum().backward(); },
                          {"checkpoint 'block7'", described, "modified in place after the forward",
                           "clone it before changing it in place"});
}

TEST_P(Checkpoint, ACapturedTensorChangedInPlaceBeforeBackwardIsRefused) {
  at::Tensor x = torch::randn({4, 3}, torch::requires_grad());
  at::Tensor scale = torch::randn({3});  // captured, not an input, no grad
  expect_in_place_change_refused([&](const at::Tensor& in) { return (in * scale).tanh(); }, x, [&] { scale.add_(1); },
                                 "Float[3]");
}

TEST_P(Checkpoint, AParameterChangedInPlaceBeforeBackwardIsRefused) {
  torch::manual_seed(0);
  torch::nn::Linear linear(3, 5);
  at::Tensor x = torch::randn({4, 3}, torch::requires_grad());
  auto optimizer_like_step = [&] {
    torch::NoGradGuard no_grad;
    linear->weight.sub_(0.1);
  };
  expect_in_place_change_refused([&](const at::Tensor& in) { return linear(in).relu(); }, x, optimizer_like_step,
                                 "Float[5, 3]");
}

TEST_P(Checkpoint, AnInputChangedInPlaceBeforeBackwardIsRefusedNamingTheCheckpoint) {
  at::Tensor leaf = torch::randn({2, 6}, torch::requires_grad());
  at::Tensor x = leaf * 1;  // a non-leaf, so it may change in place
  expect_in_place_change_refused([](const at::Tensor& in) { return in.sin(); }, x, [&] { x.mul_(2); }, "Float[2, 6]");
}

TEST_P(Checkpoint, ChangesTheBackwardDoesNotReadAreAccepted) {
  torch::manual_seed(0);
  torch::nn::Linear linear(3, 3);
  at::Tensor x = torch::randn({4, 3});
  // A result no operation saved (a matmul saves its inputs), changed in place: accepted as in the
  // plain run, with the plain gradients.
  auto run = [&](bool checkpointed) {
    linear->zero_grad();
    auto fn = [&](const at::Tensor& in) { return linear(in); };
    at::Tensor y = checkpointed ? remat::checkpoint(fn, x) : fn(x);
    y.mul_(3);
    y.pow(2).sum().backward();
    return linear->weight.grad().clone();
  };
  EXPECT_TRUE(bitwise_equal(run(false), run(true)));
  // A parameter changed after backward (the optimizer step in its place): the next step is fine.
  {
    torch::NoGradGuard no_grad;
    linear->weight.sub_(0.1);
  }
  EXPECT_TRUE(bitwise_equal(run(false), run(true)));
}

TEST_P(Checkpoint, ABatchNormSharedByTwoCheckpointsRestoresItsStatisticsWithoutARefusal) {
  torch::manual_seed(0);
  torch::nn::BatchNorm1d bn(4);
  at::Tensor x = torch::randn({16, 4}, torch::requires_grad());
  auto fn = [&](const at::Tensor& in) { return bn(in).relu(); };
  const auto options = remat::CheckpointOptions().restore_after_recompute(bn->buffers());
  at::Tensor a = remat::checkpoint(fn, x, options);
  at::Tensor b = remat::checkpoint(fn, x * 2, options);
  const at::Tensor statistics = bn->running_mean.clone();
  (a.sum() + b.pow(2).sum()).backward({}, /*retain_graph=*/true);
  a.sum().backward();  // a second backward recomputes `a` again
  EXPECT_TRUE(bitwise_equal(statistics, bn->running_mean));
}

// ---------------------------------------------------------------------------------------------
// What only the non-reentrant mode does.

TEST(NonReentrantCheckpoint, RecomputeStopsOnceEverySavedTensorIsBack) {
  torch::manual_seed(0);
  torch::nn::Linear a(8, 8), b(8, 8);
  std::vector<std::string> ran;
  auto fn = [&](const at::Tensor& x) {
    ran.push_back("a");
    at::Tensor h = a(x).tanh();
    ran.push_back("b");
    at::Tensor y = b(h);  // saves h and b's weight before its matmul runs: the last saved tensors
    ran.push_back("tail");
    return y * 2 + 1;  // saves nothing
  };
  at::Tensor x = torch::randn({4, 8}, torch::requires_grad());
  at::Tensor out = remat::checkpoint(fn, x, remat::CheckpointOptions().use_reentrant(false));
  EXPECT_EQ(ran, (std::vector<std::string>{"a", "b", "tail"}));
  out.sum().backward();
  EXPECT_EQ(ran, (std::vector<std::string>{"a", "b", "tail", "a", "b"}))
      << "one recompute, stopped inside b's linear, before the function's last operations";
  const at::Tensor grad = x.grad().clone();
  x.mutable_grad().reset();
  fn(x).sum().backward();
  EXPECT_TRUE(bitwise_equal(grad, x.grad()));
}

TEST(NonReentrantCheckpoint, ASegmentsBackwardHoldsOneParameterGradientAtATime) {
  // Accumulating into existing gradients: the reentrant node returns every parameter's gradient
  // at once (K weights' bytes), the non-reentrant backward adds each as its node finishes.
  remat::install_cpu_memory_tracker();
  constexpr int64_t n = 256, layers = 4, weight_bytes = n * n * 4;
  torch::manual_seed(0);
  std::vector<torch::nn::Linear> linears;
  for (int i = 0; i < layers; ++i) linears.emplace_back(torch::nn::LinearOptions(n, n).bias(false));
  auto fn = [&](const at::Tensor& x) {
    at::Tensor h = x;
    for (auto& l : linears) h = l(h).tanh();
    return h;
  };
  const at::Tensor x = torch::randn({2, n}, torch::requires_grad());
  auto backward_peak = [&](bool reentrant) {
    remat::checkpoint(fn, x, remat::CheckpointOptions().use_reentrant(reentrant)).sum().backward();  // grads exist
    at::Tensor loss = remat::checkpoint(fn, x, remat::CheckpointOptions().use_reentrant(reentrant)).sum();
    const int64_t before = remat::memory_stats().current_bytes;
    remat::reset_peak_memory();
    loss.backward();
    return remat::memory_stats().peak_bytes - before;
  };
  const int64_t reentrant = backward_peak(true), non_reentrant = backward_peak(false);
  EXPECT_GE(reentrant, layers * weight_bytes);
  EXPECT_LT(non_reentrant, 2 * weight_bytes);
}

TEST(NonReentrantCheckpoint, ARecomputeThatSavesOtherTensorsIsAnErrorNamingTheFunction) {
  // Same output either way: the reentrant mode cannot tell; the saved tensors differ.
  int calls = 0;
  at::Tensor x = torch::randn({6}, torch::requires_grad());
  at::Tensor out = remat::checkpoint(
      [&](const at::Tensor& in) { return ++calls == 1 ? in.exp().sum() : in.narrow(0, 0, 3).exp().sum() * 2; }, x,
      remat::CheckpointOptions().name("drifting").use_reentrant(false).check_reads(false));
  expect_error_containing(
      [&] { out.backward(); },
      {"checkpoint 'drifting'", "saved tensor 0 of the recompute is Float[3]", "the forward's was Float[6]"});
}

TEST(NonReentrantCheckpoint, NestedCheckpointsAcceptALeafPassedOnUnchanged) {
  // The inner checkpoint receives the outer one's input as it is, and that input is a leaf that
  // requires grad: saved undetached, its recompute met "No grad accumulator for a saved leaf".
  torch::manual_seed(0);
  torch::nn::Linear a(6, 6);
  const auto inner = [&](const at::Tensor& x) { return a(x).tanh() * x; };
  const auto outer = [&](const at::Tensor& x) {
    return remat::checkpoint(inner, x, remat::CheckpointOptions().use_reentrant(false)).sin();
  };
  at::Tensor x = torch::randn({3, 6}, torch::requires_grad());
  remat::checkpoint(outer, x, remat::CheckpointOptions().use_reentrant(false)).sum().backward();
  const at::Tensor x_grad = x.grad().clone(), w_grad = a->weight.grad().clone();
  x.mutable_grad().reset();
  a->weight.mutable_grad().reset();
  a(x).tanh().mul(x).sin().sum().backward();
  EXPECT_TRUE(bitwise_equal(x_grad, x.grad()));
  EXPECT_TRUE(bitwise_equal(w_grad, a->weight.grad()));
}

TEST(NonReentrantCheckpoint, MixedNestingGivesThePlainGradients) {
  torch::manual_seed(0);
  torch::nn::Linear a(6, 6), b(6, 6);
  auto inner = [&](const at::Tensor& x) { return b(x).tanh(); };
  auto plain = [&](const at::Tensor& x) { return inner(a(x).sin()) + x; };
  const at::Tensor x = torch::randn({3, 6});
  const at::Tensor plain_grad = input_grad(plain, x, false);
  const auto plain_a = remat::testing::parameter_grads(*a), plain_b = remat::testing::parameter_grads(*b);
  for (const bool outer_reentrant : {true, false}) {
    SCOPED_TRACE(outer_reentrant ? "reentrant outside, non-reentrant inside"
                                 : "non-reentrant outside, reentrant inside");
    a->zero_grad();
    b->zero_grad();
    auto nested = [&](const at::Tensor& in) {
      return remat::checkpoint(inner, a(in).sin(), remat::CheckpointOptions().use_reentrant(!outer_reentrant)) + in;
    };
    at::Tensor leaf = x.clone().requires_grad_(true);
    remat::checkpoint(nested, leaf, remat::CheckpointOptions().use_reentrant(outer_reentrant)).pow(2).sum().backward();
    EXPECT_TRUE(bitwise_equal(plain_grad, leaf.grad()));
    remat::testing::expect_same_grads(plain_a, remat::testing::parameter_grads(*a));
    remat::testing::expect_same_grads(plain_b, remat::testing::parameter_grads(*b));
  }
}

TEST(NonReentrantCheckpoint, ParameterHooksFireInThePlainOrder) {
  torch::manual_seed(0);
  torch::nn::Linear a(4, 4), b(4, 4), c(4, 4);
  auto fn = [&](const at::Tensor& x) { return c(b(a(x).relu()).relu()); };
  auto order = [&](int how) {  // 0 plain, 1 reentrant, 2 non-reentrant
    std::vector<std::string> fired;
    std::vector<std::pair<at::Tensor, unsigned>> hooks;
    for (auto* m : {&a, &b, &c}) {
      const std::string name = m == &a ? "a" : m == &b ? "b" : "c";
      at::Tensor w = (*m)->weight;
      hooks.emplace_back(w, w.register_hook([&fired, name](const at::Tensor&) { fired.push_back(name); }));
    }
    at::Tensor x = torch::randn({2, 4});
    at::Tensor y = how == 0 ? fn(x) : remat::checkpoint(fn, x, remat::CheckpointOptions().use_reentrant(how == 1));
    y.sum().backward();
    for (auto& [w, id] : hooks) w.remove_hook(id);
    return fired;
  };
  const auto plain = order(0);
  EXPECT_EQ(plain, (std::vector<std::string>{"c", "b", "a"}));
  EXPECT_EQ(order(2), plain);
}

TEST(CheckpointOptions, UseReentrantIsPyTorchsNameForTheMode) {
  EXPECT_EQ(remat::CheckpointOptions().use_reentrant(false).mode(), remat::CheckpointMode::non_reentrant);
  EXPECT_EQ(remat::CheckpointOptions().use_reentrant(true).mode(), remat::CheckpointMode::reentrant);
}
