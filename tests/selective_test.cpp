// Selective checkpointing (a policy per operator call) and the recompute's check of what it reads:
// gradients bitwise against the unchecked run under each preset, kept calls not run again, the
// hazards (in-place changes of kept results, views, random calls, data-dependent code, nesting,
// autocast, autograd::grad, a second backward), captured tensors changed or rebound after the
// forward, and no interception outside such checkpoints. Every test runs in both modes.
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
#include "remat/planning/budget_planner.h"
#include "remat/memory/memory.h"
#include "remat/chain/plan.h"
#include "remat/chain/policies.h"
#include "remat/planning/profiler.h"
#include "remat/chain/sequential_chain.h"
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
// The generic stage option, planned for any chain.

namespace {

// A dear matrix product followed by a cheap elementwise tail that holds most of the stage's memory:
// keeping the product and recomputing the tail ("sac") costs little, recomputing the stage costs
// the product again.
struct ProductAndTailImpl : nn::Module {
  nn::Linear fc{nullptr};
  explicit ProductAndTailImpl(int64_t width) { fc = register_module("fc", nn::Linear(width, width)); }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = fc(x);
    return (y.tanh() * y.sigmoid()).sin().cos().mul(0.5) + x;
  }
};
TORCH_MODULE(ProductAndTail);

}  // namespace

TEST(SelectiveStageOption, EveryChainAcceptsItAndRunsItWithThePlainGradients) {
  torch::manual_seed(0);
  nn::Sequential net(ProductAndTail(32), ProductAndTail(32), ProductAndTail(32));
  const at::Tensor x = torch::randn({8, 32});
  remat::SequentialChain chain(net, [](const at::Tensor& out) { return out.pow(2).sum(); });
  EXPECT_EQ(chain.accepted_options(0), (std::vector<std::string>{"full", "sac"}));
  remat::Plan plan = remat::Plan::plain(chain);
  plan.options[1] = remat::kSelectiveOption;
  plan.validate_against(chain);
  auto grads_under = [&](const remat::Plan& p) {
    net->zero_grad();
    remat::run_plan(chain, p, x).backward();
    std::vector<at::Tensor> grads;
    for (const auto& param : net->parameters()) grads.push_back(param.grad().clone());
    return grads;
  };
  const auto plain = grads_under(remat::Plan::plain(chain));
  const auto selective = grads_under(plan);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(bitwise_equal(plain[i], selective[i])) << i;
  plan.options[1] = "keep-everything";
  expect_error_containing([&] { plan.validate_against(chain); },
                          {"has no option 'keep-everything'", "it offers: full sac"});
}

TEST(SelectiveStageOption, ThePolicySacPutsItOnEveryBlock) {
  torch::manual_seed(0);
  nn::Sequential net(ProductAndTail(8), ProductAndTail(8), ProductAndTail(8), ProductAndTail(8));
  remat::SequentialChain chain(net, [](const at::Tensor& out) { return out.sum(); });
  EXPECT_EQ(remat::policy_plan("sac", chain).to_string(),
            "productandtail0:sac productandtail1:sac productandtail2:sac productandtail3:sac loss");
  EXPECT_EQ(remat::policy_plan("sac,skip-ends", chain).to_string(),
            "productandtail0 productandtail1:sac productandtail2:sac productandtail3 loss");
}

TEST(SelectiveStageOption, APlanPicksItWhereKeepingTheProductsPays) {
  remat::install_cpu_memory_tracker();
  torch::manual_seed(0);
  nn::Sequential net;
  for (int i = 0; i < 6; ++i) net->push_back(ProductAndTail(256));
  const at::Tensor x = torch::randn({512, 256});
  remat::SequentialChain chain(net, [](const at::Tensor& out) { return out.pow(2).mean(); });
  remat::CostTable costs = remat::profile_chain(chain, x, remat::ProfileOptions().selective_option(true));
  // Bytes are measured (exact); times are set, so the choice does not rest on a loaded machine's
  // noise: sac runs the stage's forward and adds a tenth of it to its backward (the tail's
  // recompute), a segment recomputes the whole forward.
  for (int i = 0; i < 6; ++i) {
    remat::StageCost& stage = costs.stages[i];
    const remat::StageOptionCost& full = stage.option("full");
    for (auto& o : stage.options) {
      if (o.option != remat::kSelectiveOption) continue;
      o.forward_seconds = full.forward_seconds;
      o.backward_seconds = full.backward_seconds + 0.1 * full.forward_seconds;
      o.graph_only.reset();
    }
    stage.nograd_seconds = full.forward_seconds;
  }
  remat::Plan every_stage_selective = costs.plain_plan();
  for (int i = 0; i < 6; ++i) every_stage_selective.options[i] = remat::kSelectiveOption;
  const remat::Prediction plain = remat::simulate(costs.plain_plan(), costs);
  const remat::Prediction selective = remat::simulate(every_stage_selective, costs);
  ASSERT_LT(selective.peak_bytes, plain.peak_bytes * 3 / 4) << costs.to_table();
  const remat::Budget budget = remat::Budget::bytes(selective.peak_bytes);
  const remat::PlanResult result =
      remat::plan_verified(costs, budget, remat::PlannerOptions(),
                           [&](const remat::Plan& p) { return remat::measure_plan_peak(chain, p, x); });
  ASSERT_TRUE(result.feasible) << costs.to_table();
  EXPECT_NE(result.plan.to_string().find(":sac"), std::string::npos) << result.plan.to_string() << "\n"
                                                                     << costs.to_table();
  EXPECT_LE(result.measured_peak_bytes, selective.peak_bytes);
}
