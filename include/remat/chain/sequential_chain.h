// remat/chain/sequential_chain.h — any sequential model as a chain the planner can plan for.
//
//   torch::nn::Sequential net(...);                                    // your model
//   remat::SequentialChain chain(net, [&](const at::Tensor& out) { return F::mse_loss(out, target); });
//   remat::PlanResult p = remat::make_plan(remat::PlanRequest::of_budget("50%"), {chain, x});  // make_plan.h
//   at::Tensor loss = remat::run_plan(chain, p.plan, x);  loss.backward();
//
// Each module (or each group of consecutive modules, SequentialChainOptions::group_sizes) is a stage
// and a block of its own, so the generic policies (policies.h) apply as they read; with a loss
// function the chain ends in a "loss" stage returning it. Stages may also be functions with options
// of their own (SequentialStage). Modules must map one tensor to one tensor; inputs may have any
// dtype and shape (images, embeddings, token ids). Buffers (BatchNorm running statistics) of
// modules in training mode are restored after recomputes: they update once per step under every plan.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include "remat/chain/chain.h"

namespace remat {

/// A function of the model's last output returning a scalar loss.
using LossFunction = std::function<at::Tensor(const at::Tensor& output)>;

/// One stage given as a function: it runs `forward(input, option)` with one of `options`.
struct SequentialStage {
  std::string name;
  std::function<at::Tensor(const at::Tensor& input, const std::string& option)> forward;
  /// The modules whose parameters and buffers the stage uses.
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
  std::vector<std::string> options = {"full"};  ///< options[0] is the default
};

struct SequentialChainOptions {
  /// Consecutive modules per stage, in order, summing to the number of modules; empty: one each.
  TORCH_ARG(std::vector<int64_t>, group_sizes) = {};
};

class SequentialChain : public Chain {
 public:
  /// The modules of `sequential`, in order; `loss` (optional) makes a last "loss" stage.
  explicit SequentialChain(const torch::nn::Sequential& sequential, LossFunction loss = nullptr,
                           const SequentialChainOptions& options = {});
  /// Named modules (each mapping one tensor to one tensor), in order.
  SequentialChain(const std::vector<std::pair<std::string, torch::nn::AnyModule>>& modules, LossFunction loss = nullptr,
                  const SequentialChainOptions& options = {});
  /// Stages given as functions.
  explicit SequentialChain(std::vector<SequentialStage> stages, LossFunction loss = nullptr);

  /// Sets (or, with nullptr, removes) the loss: changes the chain's stages, so plan again after.
  void set_loss(LossFunction loss);
  bool has_loss() const { return static_cast<bool>(loss_); }

  const std::vector<StageInfo>& stages() const override { return infos_; }
  std::string granularity() const override { return granularity_; }
  at::Tensor forward_stage(int64_t index, const at::Tensor& input, const std::string& option) override;
  std::vector<at::Tensor> stage_parameters(int64_t index) const override;
  std::vector<std::string> stage_parameter_names(int64_t index) const override;
  std::vector<at::Tensor> stage_buffers(int64_t index) const override;
  /// Module types and parameter shapes; empty for stages given as functions.
  std::string stage_signature(int64_t index) const override;

  /// Runs every stage plainly, without the loss: the model's forward.
  at::Tensor forward(const at::Tensor& input);

 private:
  struct Stage {
    SequentialStage stage;
    std::vector<std::string> module_names;  // prefixes of their parameters' names
  };
  void rebuild_infos();

  std::vector<Stage> stages_;
  LossFunction loss_;
  std::string granularity_;
  std::vector<StageInfo> infos_;
};

}  // namespace remat
