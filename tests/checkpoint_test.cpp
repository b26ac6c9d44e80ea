// The checkpoint mechanism: gradients, parameters, RNG, autocast, nesting, errors.
#include <atomic>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "detail/forward_state.h"
#include "remat/checkpoint.h"
#include "remat/memory.h"
#include "support/compare.h"

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

template <typename F>
void expect_error_containing(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    FAIL() << "expected a c10::Error";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    for (const auto& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos) << "'" << fragment << "' not in: " << message;
    }
  }
}

}  // namespace

TEST(Checkpoint, InputAndParameterGradientsEqualThePlainRun) {
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

TEST(Checkpoint, ParametersGetGradientsWhenNoInputRequiresGrad) {
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

TEST(Checkpoint, WorksWithAutogradGrad) {
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

TEST(Checkpoint, ParameterHookFiresOncePerBackward) {
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

TEST(Checkpoint, DropoutMasksAndRngStreamAreThoseOfThePlainRun) {
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

TEST(Checkpoint, WithoutRngPreservationDropoutMasksDiffer) {
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

TEST(Checkpoint, AutocastAndGradModeOfTheForwardAreReappliedInTheRecompute) {
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

TEST(Checkpoint, NestedCheckpointsGiveThePlainGradients) {
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

TEST(Checkpoint, UnderNoGradRunsOnceAndKeepsNothing) {
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

TEST(Checkpoint, MultipleOutputsSomeIntegerSomeUnusedSomeUndefined) {
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

TEST(Checkpoint, InputsWithoutGradUndefinedInputsAndCapturedNonTensors) {
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

TEST(Checkpoint, NondeterministicShapeFailsInBackwardNamingTheFunction) {
  int calls = 0;
  at::Tensor x = torch::randn({6}, torch::requires_grad());
  at::Tensor out = remat::checkpoint(
      [&](const at::Tensor& in) { return ++calls == 1 ? in * 2 : in.narrow(0, 0, 3) * 2; }, x,
      remat::CheckpointOptions().name("flaky"));
  expect_error_containing([&] { out.sum().backward(); },
                          {"checkpoint 'flaky'", "output 0", "[3]", "[6]", "must compute the same"});
}

TEST(Checkpoint, NondeterministicDtypeFailsInBackward) {
  int calls = 0;
  at::Tensor x = torch::randn({6}, torch::requires_grad());
  at::Tensor out = remat::checkpoint(
      [&](const at::Tensor& in) { return ++calls == 1 ? in * 2 : (in * 2).to(at::kDouble); }, x,
      remat::CheckpointOptions().name("dtype-changer"));
  expect_error_containing([&] { out.sum().backward(); }, {"checkpoint 'dtype-changer'", "Double", "Float"});
}

TEST(Checkpoint, BackwardTwiceNeedsRetainGraph) {
  at::Tensor x = torch::randn({3}, torch::requires_grad());
  auto fn = [](const at::Tensor& in) { return in.exp(); };
  at::Tensor loss = remat::checkpoint(fn, x).sum();
  loss.backward({}, /*retain_graph=*/true);
  at::Tensor once = x.grad().clone();
  loss.backward();
  EXPECT_TRUE(x.grad().allclose(2 * once));
  expect_error_containing([&] { loss.backward(); }, {"backward through the graph a second time"});
}

TEST(Checkpoint, SavedInputsAndRecomputedGraphAreFreedAfterBackward) {
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
TEST(Checkpoint, RecomputedOutputIsNotHeldThroughTheSegmentsBackward) {
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
TEST(Checkpoint, DoubleBackwardThroughTheRecomputeGivesThePlainSecondDerivative) {
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
TEST(Checkpoint, ReturningAParameterUnchangedGivesItsGradientOnce) {
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

TEST(Checkpoint, BatchNormStatisticsUpdateOnceWithRestoreAfterRecompute) {
  torch::manual_seed(0);
  at::Tensor x = torch::randn({16, 4}) * 3 + 1;
  auto run = [&](bool checkpointed, bool restore) {
    torch::nn::BatchNorm1d bn(4);
    auto fn = [&](const at::Tensor& in) { return bn(in).relu(); };
    at::Tensor out;
    if (checkpointed) {
      auto options = remat::CheckpointOptions();
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
}

TEST(Checkpoint, ErrorsForEmptyInputsAndFunctionsReturningNoTensor) {
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

TEST(Checkpoint, CapturingANonLeafTensorThatRequiresGradIsAnError) {
  at::Tensor x = torch::randn({3}, torch::requires_grad());
  at::Tensor computed_outside = x.exp();
  expect_error_containing(
      [&] { remat::checkpoint([&](const at::Tensor& in) { return in * computed_outside; }, x); },
      {"computed outside it", "Pass that tensor in the checkpoint's inputs"});
}
