// remat/checkpoint/selective.h: selective checkpointing (a policy per operator call) and the recompute's check of
// what it reads, also tried as a hostile user would: gradients bitwise against the unchecked run under each preset,
// kept calls not run again, the hazards (in-place changes of kept results, views, random calls, calls writing an
// argument, data-dependent code, nesting, autocast, autograd::grad inside and outside the function, a second
// backward), policies that compute or misbehave, captured tensors changed or rebound after the forward, and no
// interception outside such checkpoints. Every test runs in both modes.
#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <gtest/gtest.h>
#include <torch/library.h>
#include <torch/torch.h>

#include "checkpoint/forward_state.h"
#include "remat/checkpoint/checkpoint.h"
#include "remat/checkpoint/selective.h"
#include "remat/memory/memory.h"
#include "support/checks.h"
#include "support/compare.h"

using remat::testing::expect_error_containing;

namespace nn = torch::nn;
using remat::CheckpointMode;
using remat::CheckpointOptions;
using remat::CheckpointPolicy;
using remat::testing::bitwise_equal;

// ---------------------------------------------------------------------------------------------
// A matrix product that counts how often its kernel runs: a kept call is replayed without it.
namespace {

std::atomic<int> counted_mm_runs{0};

at::Tensor counted_mm_kernel(const at::Tensor& a, const at::Tensor& b) {
  ++counted_mm_runs;
  return at::mm(a, b);
}

at::Tensor call_counted_mm(const at::Tensor& a, const at::Tensor& b) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("remat_test::counted_mm", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(a, b);
}

struct CountedMm : torch::autograd::Function<CountedMm> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    ctx->save_for_backward({a, b});
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_counted_mm(a, b);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {grads[0].mm(saved[1].t()), saved[0].t().mm(grads[0])};
  }
};

}  // namespace

TORCH_LIBRARY(remat_test, m) { m.def("counted_mm(Tensor a, Tensor b) -> Tensor"); }
TORCH_LIBRARY_IMPL(remat_test, CPU, m) { m.impl("counted_mm", counted_mm_kernel); }
TORCH_LIBRARY_IMPL(remat_test, Autograd, m) {
  m.impl("counted_mm", [](const at::Tensor& a, const at::Tensor& b) { return CountedMm::apply(a, b); });
}

namespace {

class Selective : public ::testing::TestWithParam<CheckpointMode> {
 protected:
  CheckpointOptions options() const { return CheckpointOptions().mode(GetParam()); }
  CheckpointOptions with(remat::SelectivePolicy policy) const { return options().selective(std::move(policy)); }
};

// A Transformer-like block: linear (addmm/mm), layer_norm, gelu, softmax, dropout, a residual.
struct Block {
  nn::Linear fc1{nn::LinearOptions(16, 32)}, fc2{nn::LinearOptions(32, 16)}, scores{nn::LinearOptions(16, 16)};
  nn::LayerNorm norm{nn::LayerNormOptions({16})};
  std::vector<at::Tensor> parameters() const {
    std::vector<at::Tensor> all;
    for (const auto* m : std::initializer_list<const nn::Module*>{fc1.get(), fc2.get(), scores.get(), norm.get()}) {
      for (const auto& p : m->parameters()) all.push_back(p);
    }
    return all;
  }
  at::Tensor operator()(const at::Tensor& x) {
    at::Tensor h = norm(x);
    at::Tensor attention = torch::softmax(scores(h), -1);
    h = torch::dropout(torch::gelu(fc1(h * attention)), 0.3, /*train=*/true);
    return x + fc2(h);
  }
};

struct Gradients {
  at::Tensor input;
  std::vector<at::Tensor> parameters;
};

// One forward and backward of `run` on a leaf copy of `x`, seeded, with sum(out²) as the loss.
Gradients gradients_of(Block& block, const at::Tensor& x, const std::function<at::Tensor(const at::Tensor&)>& run) {
  for (auto& p : block.parameters()) p.mutable_grad() = at::Tensor();
  at::Tensor leaf = x.detach().clone().requires_grad_(true);
  torch::manual_seed(7);
  run(leaf).pow(2).sum().backward();
  Gradients g{leaf.grad(), {}};
  for (const auto& p : block.parameters()) g.parameters.push_back(p.grad().clone());
  return g;
}

void expect_bitwise(const Gradients& expected, const Gradients& got) {
  EXPECT_TRUE(bitwise_equal(expected.input, got.input));
  ASSERT_EQ(expected.parameters.size(), got.parameters.size());
  for (size_t i = 0; i < expected.parameters.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(expected.parameters[i], got.parameters[i])) << "parameter " << i;
  }
}

bool intercepting() { return c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::Fake); }

}  // namespace

INSTANTIATE_TEST_SUITE_P(Modes, Selective, ::testing::Values(CheckpointMode::reentrant, CheckpointMode::non_reentrant),
                         remat::testing::checkpoint_mode_name);

TEST_P(Selective, GradientsAreBitwiseThePlainRunsUnderEveryPreset) {
  torch::manual_seed(0);
  Block block;
  const at::Tensor x = torch::randn({4, 5, 16});
  const Gradients plain = gradients_of(block, x, [&](const at::Tensor& in) { return block(in); });
  std::vector<std::pair<std::string, remat::SelectivePolicy>> policies;
  for (const auto& name : remat::selective_policy_names()) policies.emplace_back(name, remat::selective_policy(name));
  policies.emplace_back("save_operators", remat::save_operators({"aten::native_layer_norm", "aten::gelu"}));
  policies.emplace_back("all", [](const remat::OperatorCall&) { return CheckpointPolicy::prefer_save; });
  for (const auto& [name, policy] : policies) {
    SCOPED_TRACE(name);
    const Gradients checked = gradients_of(block, x, [&, policy = policy](const at::Tensor& in) {
      return remat::checkpoint([&](const at::Tensor& v) { return block(v); }, in, with(policy));
    });
    expect_bitwise(plain, checked);
  }
}

TEST_P(Selective, KeptCallsAreNotRunAgainAndTheOthersAre) {
  torch::manual_seed(0);
  const at::Tensor w1 = torch::randn({8, 8}, torch::requires_grad()), w2 = torch::randn({8, 8}, torch::requires_grad());
  auto fn = [&](const at::Tensor& x) { return call_counted_mm(call_counted_mm(x, w1).tanh(), w2).sin(); };
  const at::Tensor x = torch::randn({4, 8}, torch::requires_grad());
  auto recompute_runs = [&](const CheckpointOptions& opts) {
    counted_mm_runs = 0;
    at::Tensor y = remat::checkpoint(fn, x, opts);
    EXPECT_EQ(counted_mm_runs.load(), 2) << "the forward runs both products";
    counted_mm_runs = 0;
    y.sum().backward();
    return counted_mm_runs.load();
  };
  EXPECT_EQ(recompute_runs(options()), 2);
  EXPECT_EQ(recompute_runs(with(remat::save_operators({"remat_test::counted_mm"}))), 0);
  EXPECT_EQ(recompute_runs(with([](const remat::OperatorCall& call) {
              return call.name == "remat_test::counted_mm" && call.name_index == 0 ? CheckpointPolicy::must_save
                                                                                   : CheckpointPolicy::prefer_recompute;
            })),
            1);
}

TEST_P(Selective, TheComputeIntensivePresetKeepsMatrixProductsAndNoMore) {
  remat::install_cpu_memory_tracker();
  torch::manual_seed(0);
  const at::Tensor w = torch::randn({64, 64}, torch::requires_grad());
  const at::Tensor x = torch::randn({32, 64}, torch::requires_grad());
  auto fn = [&](const at::Tensor& in) { return at::mm(at::mm(in, w).relu(), w).tanh().sigmoid(); };
  const int64_t product = 32 * 64 * 4;
  auto held_after_forward = [&](const CheckpointOptions& opts) {
    const int64_t before = remat::memory_stats().current_bytes;
    at::Tensor y = remat::checkpoint(fn, x, opts);
    const int64_t held = remat::memory_stats().current_bytes - before - y.nbytes();
    y.sum().backward();
    return held;
  };
  const int64_t plain = held_after_forward(options());
  EXPECT_EQ(held_after_forward(with(remat::save_compute_intensive())) - plain, 2 * product);
  EXPECT_EQ(held_after_forward(with(remat::save_every_other_matmul())) - plain, product);
}

TEST_P(Selective, AKeptResultChangedInPlaceLaterInTheForwardIsCopiedFirst) {
  torch::manual_seed(0);
  const at::Tensor w = torch::randn({8, 8}, torch::requires_grad());
  const at::Tensor x = torch::randn({4, 8});
  auto fn = [&](const at::Tensor& in) {
    at::Tensor y = at::mm(in, w);
    y.t().mul_(2);  // the kept product changed in place through a view of it,
    y.relu_();      // and directly: the anchor's bug
    return y.tanh() + y.view({-1}).view({4, 8}).cos();
  };
  auto grad_of = [&](bool checkpointed, const remat::SelectivePolicy& policy) {
    w.mutable_grad() = at::Tensor();
    at::Tensor leaf = x.clone().requires_grad_(true);
    at::Tensor out = checkpointed ? remat::checkpoint(fn, leaf, with(policy)) : fn(leaf);
    out.pow(2).sum().backward();
    return std::make_pair(leaf.grad(), w.grad().clone());
  };
  const auto plain = grad_of(false, nullptr);
  const auto checked = grad_of(true, remat::save_compute_intensive());
  EXPECT_TRUE(bitwise_equal(plain.first, checked.first));
  EXPECT_TRUE(bitwise_equal(plain.second, checked.second));
}

TEST_P(Selective, MustSaveOnACallThatChangesItsInputIsRefused) {
  const at::Tensor x = torch::randn({4, 4}, torch::requires_grad());
  auto keep_everything = [](const remat::OperatorCall&) { return CheckpointPolicy::must_save; };
  expect_error_containing(
      [&] { remat::checkpoint([](const at::Tensor& v) { return (v * 2).relu_(); }, x, with(keep_everything)); },
      {"checkpoint 'checkpoint': the selective policy returned must_save for aten::relu_", "writes its argument 'self'",
       "prefer_save"});
  // prefer_save recomputes such calls instead, and the gradients are right.
  auto prefer = [](const remat::OperatorCall&) { return CheckpointPolicy::prefer_save; };
  at::Tensor y = remat::checkpoint([](const at::Tensor& v) { return (v * 2).relu_().t(); }, x, with(prefer));
  y.sum().backward();
  EXPECT_TRUE(bitwise_equal(x.grad(), (x > 0).to(at::kFloat) * 2));
}

TEST_P(Selective, AKeptRandomCallLeavesTheRngWhereTheForwardDid) {
  // native_dropout kept, then a recomputed dropout: its mask must be the forward's.
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({64, 64});
  auto fn = [](const at::Tensor& in) {
    at::Tensor first = std::get<0>(at::native_dropout(in, 0.5, true));
    return torch::dropout(first.sin(), 0.5, true).cos();
  };
  auto grad_of = [&](bool checkpointed) {
    at::Tensor leaf = x.clone().requires_grad_(true);
    torch::manual_seed(3);
    at::Tensor out =
        checkpointed ? remat::checkpoint(fn, leaf, with(remat::save_operators({"aten::native_dropout"}))) : fn(leaf);
    out.sum().backward();
    return leaf.grad();
  };
  EXPECT_TRUE(bitwise_equal(grad_of(false), grad_of(true)));
}

TEST_P(Selective, ARecomputeThatCallsOtherOperatorsIsRefusedNamingThem) {
  bool forward = true;
  const at::Tensor x = torch::randn({4, 4}, torch::requires_grad());
  at::Tensor y = remat::checkpoint(
      [&](const at::Tensor& v) {
        at::Tensor h = at::mm(v, v);
        return forward ? h.tanh() : h.sigmoid();
      },
      x, with(remat::save_compute_intensive()).name("block2"));
  forward = false;
  expect_error_containing([&] { y.sum().backward(); },
                          {"checkpoint 'block2': the recompute's operator call 1 is aten::sigmoid but the forward's "
                           "was aten::tanh",
                           "same operator calls"});
}

TEST_P(Selective, NestedCheckpointsWithAndWithoutPoliciesGiveThePlainGradients) {
  torch::manual_seed(0);
  Block block;
  const at::Tensor x = torch::randn({4, 5, 16});
  const Gradients plain = gradients_of(block, x, [&](const at::Tensor& in) { return block(block(in)); });
  auto inner_policy = [&](const at::Tensor& in) {
    return remat::checkpoint([&](const at::Tensor& v) { return block(v); }, in, with(remat::save_compute_intensive()));
  };
  auto inner_plain = [&](const at::Tensor& in) {
    return remat::checkpoint([&](const at::Tensor& v) { return block(v); }, in, options());
  };
  // A policy inside a plain checkpoint.
  expect_bitwise(plain, gradients_of(block, x, [&](const at::Tensor& in) {
                   return remat::checkpoint([&](const at::Tensor& v) { return inner_policy(block(v)); }, in, options());
                 }));
  // A plain checkpoint inside a policy's.
  expect_bitwise(plain, gradients_of(block, x, [&](const at::Tensor& in) {
                   return remat::checkpoint([&](const at::Tensor& v) { return inner_plain(block(v)); }, in,
                                            with(remat::save_compute_intensive()));
                 }));
  // Policies inside policies.
  expect_bitwise(plain, gradients_of(block, x, [&](const at::Tensor& in) {
                   return remat::checkpoint([&](const at::Tensor& v) { return inner_policy(block(v)); }, in,
                                            with(remat::save_every_other_matmul()));
                 }));
}

TEST_P(Selective, UnderAutocastTheGradientsAreThePlainRuns) {
  torch::manual_seed(0);
  Block block;
  const at::Tensor x = torch::randn({4, 5, 16});
  auto under_autocast = [&](const std::function<at::Tensor(const at::Tensor&)>& run) {
    return [run](const at::Tensor& in) {
      remat::detail::AutocastScope bf16(remat::detail::AutocastSnapshot{true, at::kBFloat16, false, at::kHalf});
      at::Tensor out = run(in).to(at::kFloat);
      at::autocast::clear_cache();
      return out;
    };
  };
  const Gradients plain = gradients_of(block, x, under_autocast([&](const at::Tensor& in) { return block(in); }));
  const Gradients checked = gradients_of(block, x, under_autocast([&](const at::Tensor& in) {
                                           return remat::checkpoint([&](const at::Tensor& v) { return block(v); }, in,
                                                                    with(remat::save_compute_intensive()));
                                         }));
  expect_bitwise(plain, checked);
}

TEST_P(Selective, AutogradGradAndASecondBackwardGiveThePlainGradients) {
  torch::manual_seed(0);
  Block block;
  const at::Tensor x = torch::randn({4, 5, 16}, torch::requires_grad());
  auto run = [&](bool checkpointed) {
    torch::manual_seed(1);
    return checkpointed ? remat::checkpoint([&](const at::Tensor& v) { return block(v); }, x,
                                            with(remat::save_compute_intensive()))
                        : block(x);
  };
  const at::Tensor w = block.fc1->weight;
  const auto plain = torch::autograd::grad({run(false).pow(2).sum()}, {x, w});
  const auto checked = torch::autograd::grad({run(true).pow(2).sum()}, {x, w});
  EXPECT_TRUE(bitwise_equal(plain[0], checked[0]));
  EXPECT_TRUE(bitwise_equal(plain[1], checked[1]));
  // retain_graph: the second backward recomputes every call (the kept results served the first).
  at::Tensor loss = run(true).pow(2).sum();
  const auto first = torch::autograd::grad({loss}, {x, w}, {}, /*retain_graph=*/true);
  const auto second = torch::autograd::grad({loss}, {x, w});
  EXPECT_TRUE(bitwise_equal(first[0], second[0]));
  EXPECT_TRUE(bitwise_equal(first[1], second[1]));
  EXPECT_TRUE(bitwise_equal(plain[1], second[1]));
}

TEST_P(Selective, NothingIsInterceptedOutsideACheckpointThatChecksOrKeeps) {
  const at::Tensor x = torch::randn({4, 4}, torch::requires_grad());
  bool seen_default = false, seen_unchecked = true, seen_policy = false, seen_nested_unchecked = true;
  EXPECT_FALSE(intercepting());
  auto probe = [&](bool& seen, const at::Tensor& v) {
    seen = intercepting();
    return v.sin();
  };
  remat::checkpoint([&](const at::Tensor& v) { return probe(seen_default, v); }, x, options()).sum().backward();
  remat::checkpoint([&](const at::Tensor& v) { return probe(seen_unchecked, v); }, x, options().check_reads(false))
      .sum()
      .backward();
  remat::checkpoint(
      [&](const at::Tensor& v) {
        seen_policy = intercepting();
        return remat::checkpoint([&](const at::Tensor& u) { return probe(seen_nested_unchecked, u); }, v,
                                 options().check_reads(false));
      },
      x, with(remat::save_compute_intensive()))
      .sum()
      .backward();
  EXPECT_TRUE(seen_default);  // captured tensors are checked by default
  EXPECT_FALSE(seen_unchecked);
  EXPECT_TRUE(seen_policy);
  EXPECT_FALSE(seen_nested_unchecked);
  EXPECT_FALSE(intercepting());
}

// ---------------------------------------------------------------------------------------------
// The recompute reads what the forward read.

TEST_P(Selective, ACapturedTensorChangedInPlaceAfterTheForwardIsRefused) {
  for (const bool w_requires_grad : {false, true}) {
    SCOPED_TRACE(w_requires_grad);
    at::Tensor w = torch::randn({4, 4});
    if (w_requires_grad) w.requires_grad_(true);
    const at::Tensor x = torch::randn({4, 4}, torch::requires_grad());
    at::Tensor y = remat::checkpoint([&](const at::Tensor& v) { return (v + w).tanh(); }, x,
                                     options().check_reads(true).name("captures w"));
    {
      torch::NoGradGuard no_grad;
      w.add_(1);
    }
    // A w that requires grad is an input of the reentrant checkpoint's node, refused before the recompute.
    std::vector<std::string> expected = {"checkpoint 'captures w': ", "Float[4, 4]",
                                         "modified in place after the forward"};
    if (!w_requires_grad || GetParam() == CheckpointMode::non_reentrant) expected.push_back("call of aten::add.Tensor");
    expect_error_containing([&] { y.sum().backward(); }, expected);
  }
}

TEST_P(Selective, ACapturedTensorReboundAfterTheForwardIsRefused) {
  at::Tensor w = torch::randn({4, 4});
  const at::Tensor x = torch::randn({4, 4}, torch::requires_grad());
  at::Tensor y = remat::checkpoint([&](const at::Tensor& v) { return (v + w).tanh(); }, x,
                                   with(remat::save_compute_intensive()).name("captures w"));
  w = w + 1;
  expect_error_containing([&] { y.sum().backward(); },
                          {"checkpoint 'captures w': the recompute's call of aten::add.Tensor (operator call 0)",
                           "where the forward's call read another", "w = w + 1"});
}

TEST_P(Selective, CapturedTensorsChangedAfterTheBackwardAreAccepted) {
  at::Tensor w = torch::randn({4, 4});
  const at::Tensor x = torch::randn({4, 4});
  auto fn = [&](const at::Tensor& v) { return (v + w).tanh(); };
  at::Tensor leaf = x.clone().requires_grad_(true), plain_leaf = x.clone().requires_grad_(true);
  remat::checkpoint(fn, leaf, options().check_reads(true)).sum().backward();
  fn(plain_leaf).sum().backward();
  EXPECT_TRUE(bitwise_equal(plain_leaf.grad(), leaf.grad()));
  w.add_(1);
  w = w * 2;
  // A capture rebound to a tensor of the same values is the same input: accepted.
  at::Tensor same_leaf = x.clone().requires_grad_(true);
  at::Tensor y = remat::checkpoint(fn, same_leaf, options().check_reads(true));
  w = w.clone();
  y.sum().backward();
  EXPECT_TRUE(same_leaf.grad().defined());
}

TEST_P(Selective, AKeptResultChangedAfterTheForwardIsComputedAgain) {
  torch::manual_seed(0);
  const at::Tensor w = torch::randn({4, 4}, torch::requires_grad());
  const at::Tensor x = torch::randn({4, 4});
  auto fn = [&](const std::vector<at::Tensor>& v) {
    at::Tensor product = at::mm(v[0], w);
    return std::vector<at::Tensor>{product, product.tanh()};
  };
  auto grad_of = [&](bool checkpointed) {
    at::Tensor leaf = x.clone().requires_grad_(true);
    auto outputs = checkpointed ? remat::checkpoint(fn, {leaf}, with(remat::save_compute_intensive())) : fn({leaf});
    {
      torch::NoGradGuard no_grad;
      outputs[0].add_(1);  // tanh's backward reads its own result: the plain run accepts this
    }
    outputs[1].sum().backward();
    return leaf.grad();
  };
  EXPECT_TRUE(bitwise_equal(grad_of(false), grad_of(true)));
}

TEST(SelectivePolicies, PresetsAndNamesAreChecked) {
  expect_error_containing([] { remat::selective_policy("matmuls"); },
                          {"unknown selective policy 'matmuls'", "compute-intensive", "every-other-matmul"});
  expect_error_containing([] { remat::save_operators({"mm"}); }, {"'mm' is not an operator name", "aten::mm"});
  remat::OperatorCall call;
  call.name = "aten::mm";
  EXPECT_EQ(remat::save_compute_intensive()(call), CheckpointPolicy::prefer_save);
  call.name_index = 1;
  EXPECT_EQ(remat::save_every_other_matmul()(call), CheckpointPolicy::prefer_recompute);
  call.name = "aten::gelu";
  EXPECT_EQ(remat::save_compute_intensive()(call), CheckpointPolicy::prefer_recompute);
  call.name = "aten::add";
  call.overload = "Tensor";
  EXPECT_EQ(remat::save_operators({"aten::add.Tensor"})(call), CheckpointPolicy::prefer_save);
  call.overload = "Scalar";
  EXPECT_EQ(remat::save_operators({"aten::add.Tensor"})(call), CheckpointPolicy::prefer_recompute);
}

TEST(SelectiveCheckpoint, GradientsAreThePlainRuns_CUDA) {
  for (const CheckpointMode mode : {CheckpointMode::reentrant, CheckpointMode::non_reentrant}) {
    torch::manual_seed(0);
    Block block;
    block.fc1->to(torch::kCUDA);
    block.fc2->to(torch::kCUDA);
    block.scores->to(torch::kCUDA);
    block.norm->to(torch::kCUDA);
    const at::Tensor x = torch::randn({4, 5, 16}, torch::kCUDA);
    const Gradients plain = gradients_of(block, x, [&](const at::Tensor& in) { return block(in); });
    const Gradients checked = gradients_of(block, x, [&](const at::Tensor& in) {
      return remat::checkpoint([&](const at::Tensor& v) { return block(v); }, in,
                               CheckpointOptions().mode(mode).selective(remat::save_compute_intensive()));
    });
    EXPECT_TRUE(at::allclose(plain.input, checked.input, 1e-5, 1e-6)) << remat::to_string(mode);
    for (size_t i = 0; i < plain.parameters.size(); ++i) {
      EXPECT_TRUE(at::allclose(plain.parameters[i], checked.parameters[i], 1e-5, 1e-6)) << i;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Hostile use (issue 39): random calls that take no generator, kept calls that write an argument, a gradient
// penalty through autograd::grad inside the function, policies that compute or misbehave, writes made inside the
// function, captured tensors changed after the forward under default options, and "keep everything" on a real
// block.

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
