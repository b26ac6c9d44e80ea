// A user's own model in the first hour (issue 46): a U-Net-like residual net with BatchNorm and
// dropout whose every residual block and decoder level is checkpointed with no options given;
// gradients and, over three SGD steps, parameters and running statistics bitwise the unchecked
// run's. The module-holder form of checkpoint, the default mode, the thread warning, and a share
// of a budget taken of the measured unchecked peak.
#include <cstdlib>
#include <sstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/base/threads.h"
#include "remat/chain/plan.h"
#include "remat/chain/sequential_chain.h"
#include "remat/checkpoint/checkpoint.h"
#include "autoplan/verified_plan.h"
#include "remat/autoplan/make_plan.h"
#include "support/checks.h"

namespace {

namespace nn = torch::nn;
namespace F = torch::nn::functional;

// Conv, BatchNorm, ReLU, conv, BatchNorm, plus the input: the block a U-Net level stacks.
struct ResidualBlockImpl : nn::Module {
  explicit ResidualBlockImpl(int64_t channels)
      : conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(channels, channels, 3).padding(1).bias(false)))),
        norm1(register_module("norm1", nn::BatchNorm2d(channels))),
        conv2(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(channels, channels, 3).padding(1).bias(false)))),
        norm2(register_module("norm2", nn::BatchNorm2d(channels))) {}
  at::Tensor forward(const at::Tensor& x) {
    return torch::relu(x + norm2(conv2(F::dropout(torch::relu(norm1(conv1(x))), F::DropoutFuncOptions().p(0.1)))));
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d norm1;
  nn::Conv2d conv2;
  nn::BatchNorm2d norm2;
};
TORCH_MODULE(ResidualBlock);

// Two levels down, two up; each decoder level reads its encoder level's output (a skip), and the
// input of every checkpointed block is also used outside it (the residual sum after it).
struct UNetImpl : nn::Module {
  UNetImpl() {
    stem = register_module("stem", nn::Conv2d(nn::Conv2dOptions(3, 8, 3).padding(1)));
    for (int64_t level = 0; level < 3; ++level) {
      const int64_t width = 8 << level;
      down.push_back(register_module("down" + std::to_string(level), ResidualBlock(width)));
      if (level < 2) {
        widen.push_back(register_module("widen" + std::to_string(level),
                                        nn::Conv2d(nn::Conv2dOptions(width, 2 * width, 3).stride(2).padding(1))));
        merge.push_back(register_module("merge" + std::to_string(level),
                                        nn::Conv2d(nn::Conv2dOptions(3 * width, width, 3).padding(1))));
        up.push_back(register_module("up" + std::to_string(level), ResidualBlock(width)));
      }
    }
    head = register_module("head", nn::Conv2d(nn::Conv2dOptions(8, 2, 1)));
  }

  // `checkpointed`: every residual block and decoder level through remat::checkpoint, no options.
  at::Tensor forward(const at::Tensor& image, bool checkpointed) {
    auto block = [&](ResidualBlock b, const at::Tensor& x) { return checkpointed ? remat::checkpoint(b, x) : b(x); };
    std::vector<at::Tensor> skips;
    at::Tensor x = stem(image);
    for (size_t level = 0; level < down.size(); ++level) {
      x = block(down[level], x);
      x = x + 0.5 * x.tanh();  // the block's output used again outside it
      if (level + 1 < down.size()) {
        skips.push_back(x);
        x = widen[level](x);
      }
    }
    for (size_t level = merge.size(); level-- > 0;) {
      nn::Conv2d merge_conv = merge[level];
      auto decode = [merge_conv](const std::vector<at::Tensor>& in) mutable {
        const at::Tensor upsampled =
            F::interpolate(in[0], F::InterpolateFuncOptions().scale_factor(std::vector<double>{2, 2}));
        return std::vector<at::Tensor>{torch::relu(merge_conv(torch::cat({upsampled, in[1]}, 1)))};
      };
      x = checkpointed ? remat::checkpoint(decode, {x, skips[level]})[0] : decode({x, skips[level]})[0];
      x = block(up[level], x);
    }
    return head(x);
  }

  nn::Conv2d stem{nullptr}, head{nullptr};
  std::vector<ResidualBlock> down, up;
  std::vector<nn::Conv2d> widen, merge;
};
TORCH_MODULE(UNet);

struct StepResult {
  std::vector<at::Tensor> gradients;  // of the first step
  std::vector<at::Tensor> state;      // parameters and buffers after every step
  std::vector<at::Tensor> buffers;    // running statistics and batch counts after every step
  std::vector<double> losses;
};

StepResult train(bool checkpointed, int steps) {
  torch::manual_seed(0);
  UNet net;
  net->train();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  StepResult result;
  for (int step = 0; step < steps; ++step) {
    torch::manual_seed(100 + step);
    const at::Tensor image = torch::randn({4, 3, 16, 16});
    const at::Tensor target = torch::randint(0, 2, {4, 16, 16}, torch::kLong);
    sgd.zero_grad();
    at::Tensor loss = F::cross_entropy(net->forward(image, checkpointed), target);
    loss.backward();
    if (step == 0) {
      for (const auto& p : net->parameters()) result.gradients.push_back(p.grad().clone());
    }
    sgd.step();
    result.losses.push_back(loss.item<double>());
  }
  for (const auto& p : net->parameters()) result.state.push_back(p.detach().clone());
  for (const auto& b : net->buffers()) result.state.push_back(b.clone());
  for (const auto& b : net->buffers()) result.buffers.push_back(b.clone());
  return result;
}

size_t count_different(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  size_t different = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) different += a[i].equal(b[i]) ? 0 : 1;
  return different;
}

TEST(OwnModel, DefaultOptionsOnAUNetAreBitwiseAndUpdateRunningStatisticsOnce) {
  ASSERT_EQ(remat::default_checkpoint_mode(), remat::CheckpointMode::non_reentrant);
  const StepResult plain = train(false, 3);
  const StepResult checkpointed = train(true, 3);
  ASSERT_GT(plain.gradients.size(), 30u);
  EXPECT_EQ(count_different(plain.gradients, checkpointed.gradients), 0u) << "gradients of the first step";
  EXPECT_EQ(plain.losses, checkpointed.losses);
  // Parameters, then every running mean, variance and num_batches_tracked: updated once per step.
  EXPECT_EQ(count_different(plain.state, checkpointed.state), 0u) << "parameters and buffers after 3 steps";
}

TEST(OwnModel, ReentrantModeIsOneOptionAwayAndDiffersOnlyByRounding) {
  const StepResult plain = train(false, 1);
  StepResult reentrant;
  {
    remat::CheckpointModeGuard mode(remat::CheckpointMode::reentrant);
    reentrant = train(true, 1);
  }
  EXPECT_EQ(remat::default_checkpoint_mode(), remat::CheckpointMode::non_reentrant);
  ASSERT_EQ(plain.gradients.size(), reentrant.gradients.size());
  for (size_t i = 0; i < plain.gradients.size(); ++i) {
    EXPECT_TRUE(plain.gradients[i].allclose(reentrant.gradients[i], 1e-4, 1e-5)) << "gradient " << i;
  }
  // The forward is the unchecked one's in both modes, and the recompute's updates of the running
  // statistics are undone without being listed: after one step the buffers are bitwise equal.
  ASSERT_GT(plain.buffers.size(), 10u);
  EXPECT_EQ(count_different(plain.buffers, reentrant.buffers), 0u) << "buffers after one reentrant step";
  // The minimal case of the README: an input used inside and outside one checkpoint.
  const at::Tensor x = torch::randn({64}, torch::requires_grad());
  // One statement per operation: the order of evaluation of `a + b`'s operands is unspecified, and
  // it decides the order of the nodes, so of the summation, in both programs.
  auto fn = [](const at::Tensor& t) {
    const at::Tensor sine = t.sin();
    return sine + t.cos() * 3;
  };
  auto grad_of = [&](c10::optional<bool> reentrant_mode) {
    const at::Tensor h = x * 1.1;
    remat::CheckpointOptions options;
    if (reentrant_mode) options.use_reentrant(*reentrant_mode);
    const at::Tensor y = remat::checkpoint(fn, h, options);
    const at::Tensor outside = h.exp();
    return torch::autograd::grad({(y + outside).sum()}, {x})[0];
  };
  const at::Tensor h = x * 1.1;
  const at::Tensor inside = fn(h);
  const at::Tensor outside = h.exp();
  const at::Tensor unchecked = torch::autograd::grad({(inside + outside).sum()}, {x})[0];
  EXPECT_TRUE(grad_of(c10::nullopt).equal(unchecked));  // the default: bitwise
  EXPECT_TRUE(grad_of(false).equal(unchecked));
  EXPECT_TRUE(grad_of(true).allclose(unchecked, 1e-5, 1e-6));
}

TEST(OwnModel, ModuleHolderFormKeepsTheModuleAliveAndItsBuffersUpdatedOnce) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({2, 4, 8, 8}, torch::requires_grad());
  at::Tensor y;
  at::Tensor running_mean;
  {
    torch::manual_seed(1);
    ResidualBlock block(4);  // the caller's only handle dies before backward
    running_mean = block->norm1->running_mean;
    // check_reads(false): the buffers are restored because the module overload lists them.
    y = remat::checkpoint(block, x, remat::CheckpointOptions().check_reads(false).name("block"));
  }
  const at::Tensor after_forward = running_mean.clone();
  y.sum().backward();
  EXPECT_TRUE(running_mean.equal(after_forward)) << "the recompute updated the running mean again";
  ASSERT_TRUE(x.grad().defined());

  torch::manual_seed(1);
  ResidualBlock twin(4);
  const at::Tensor x2 = x.detach().clone().requires_grad_(true);
  twin(x2).sum().backward();
  // Same initial weights and RNG stream: the dropout masks and every gradient match.
  EXPECT_TRUE(x.grad().equal(x2.grad()));

  // Any holder: a Sequential and a Linear.
  nn::Sequential sequential(nn::Linear(8, 8), nn::ReLU());
  const at::Tensor z = torch::randn({3, 8}, torch::requires_grad());
  (remat::checkpoint(sequential, z) + remat::checkpoint(nn::Linear(8, 8), z)).sum().backward();
  EXPECT_TRUE(z.grad().defined());
}

TEST(OwnModel, ThreadWarningNamesTheFixAndIsShownOnce) {
  const remat::CpuThreads oversubscribed{2, 2, 2};
  const std::string warning = remat::oversubscription_warning(oversubscribed);
  EXPECT_NE(warning.find("remat::set_cpu_threads(2)"), std::string::npos) << warning;
  EXPECT_NE(warning.find("REMAT_THREAD_WARNING=0"), std::string::npos) << warning;
  EXPECT_TRUE(remat::oversubscription_warning(remat::CpuThreads{2, 1, 2}).empty());
  EXPECT_TRUE(remat::oversubscription_warning(remat::CpuThreads{4, 2, 2}).empty());

  // In this process: arranged as found, one checkpoint warns where the arrangement is
  // oversubscribed (LibTorch's defaults with OpenBLAS on 2 or more CPUs), a second one never.
  const remat::CpuThreads found = remat::cpu_threads();
  // REMAT_THREAD_WARNING=0 in the environment (scripts/sanitize.sh sets it) would silence it.
  const char* setting = std::getenv("REMAT_THREAD_WARNING");
  const std::string saved_setting = setting != nullptr ? setting : "";
  unsetenv("REMAT_THREAD_WARNING");
  struct RestoreSetting {
    const char* was;
    std::string value;
    ~RestoreSetting() {
      if (was != nullptr) setenv("REMAT_THREAD_WARNING", value.c_str(), 1);
    }
  } restore_setting{setting, saved_setting};
  remat::set_thread_warning(true);
  const at::Tensor x = torch::randn({4}, torch::requires_grad());
  auto square = [](const at::Tensor& t) { return t * t; };
  testing::internal::CaptureStderr();
  remat::checkpoint(square, x).sum().backward();
  const std::string first = testing::internal::GetCapturedStderr();
  testing::internal::CaptureStderr();
  remat::checkpoint(square, x).sum().backward();
  const std::string second = testing::internal::GetCapturedStderr();
  EXPECT_EQ(first, remat::oversubscription_warning(found)) << found;
  EXPECT_EQ(second, "");
}

nn::Sequential tanh_mlp(int layers) {
  nn::Sequential net;
  net->push_back(nn::Linear(32, 256));
  for (int layer = 0; layer < layers; ++layer) {
    net->push_back(nn::Tanh());
    net->push_back(nn::Linear(256, 256));
  }
  net->push_back(nn::Linear(256, 4));
  return net;
}

TEST(OwnModel, AShareOfTheBudgetIsOfTheMeasuredUncheckedPeak) {
  torch::manual_seed(0);
  nn::Sequential net = tanh_mlp(12);  // deep enough that 90% is well above its least-memory plan
  const at::Tensor x = torch::randn({256, 32});
  const at::Tensor labels = torch::randint(0, 4, {256}, torch::kLong);
  remat::SequentialChain chain(net, [&](const at::Tensor& out) { return F::cross_entropy(out, labels); });
  const remat::PlanResult planned = remat::make_plan(
      remat::PlanRequest::of_budget("90%").options(
          remat::PlanningOptions().choice(remat::MeasuredChoiceOptions().when(remat::ChooseByMeasurement::never))),
      {chain, x});
  const int64_t measured = remat::measure_plan_peak(chain, remat::Plan::unchecked(chain), x);
  EXPECT_EQ(planned.measured_unchecked_peak_bytes, measured);
  EXPECT_EQ(planned.budget_bytes, remat::Budget("90%").to_bytes(measured));
  EXPECT_LE(planned.measured_peak_bytes, planned.budget_bytes);
}

TEST(OwnModel, PlanVerifiedOnTheChainTakesAShareOfTheUncheckedPeakGivenOrMeasured) {
  torch::manual_seed(0);
  nn::Sequential net = tanh_mlp(12);
  const at::Tensor x = torch::randn({256, 32});
  const at::Tensor labels = torch::randint(0, 4, {256}, torch::kLong);
  remat::SequentialChain chain(net, [&](const at::Tensor& out) { return F::cross_entropy(out, labels); });
  const remat::CostTable costs = remat::profile_chain(chain, x, remat::ProfileOptions().repeats(1).max_repeats(1));
  const int64_t unchecked = remat::measure_plan_peak(chain, remat::Plan::unchecked(chain), x);

  const remat::PlanResult measured_here = remat::plan_verified(chain, costs, x, "90%");
  EXPECT_EQ(measured_here.measured_unchecked_peak_bytes, unchecked);
  EXPECT_EQ(measured_here.budget_bytes, remat::Budget("90%").to_bytes(unchecked));
  ASSERT_TRUE(measured_here.feasible);
  EXPECT_LE(measured_here.measured_peak_bytes, measured_here.budget_bytes);

  // Given (several budgets on one measurement), it is used as it is, even when it is not the truth.
  const remat::PlanResult given =
      remat::plan_verified(chain, costs, x, "90%", {}, remat::kDefaultMaxReplans, 2 * unchecked);
  EXPECT_EQ(given.measured_unchecked_peak_bytes, 2 * unchecked);
  EXPECT_EQ(given.budget_bytes, remat::Budget("90%").to_bytes(2 * unchecked));
  EXPECT_TRUE(given.feasible);

  // An absolute budget needs no unchecked step; an impossible one names the least-memory plan's peak.
  const remat::PlanResult absolute = remat::plan_verified(chain, costs, x, remat::Budget::bytes(unchecked));
  EXPECT_EQ(absolute.measured_unchecked_peak_bytes, -1);
  EXPECT_TRUE(absolute.feasible);
  const remat::PlanResult too_small = remat::plan_verified(chain, costs, x, "1%");
  EXPECT_FALSE(too_small.feasible);
  EXPECT_GT(too_small.least_feasible_budget_bytes, too_small.budget_bytes);
  EXPECT_THROW(too_small.ensure_feasible(), c10::Error);

  EXPECT_THROW(remat::plan_verified(chain, costs, x, "90%", {}, remat::kDefaultMaxReplans, 0), c10::Error);
}

}  // namespace
