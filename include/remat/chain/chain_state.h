// remat/chain/chain_state.h — a chain's state besides its result, kept across a measurement:
//
//   { remat::ChainStateGuard untouched(chain, sample);  // gradients, buffers, RNG streams saved
//     remat::run_plan(chain, plan, sample).backward(); }  // ... and put back here
//
// Profiling, verifying or measuring a model under a guard leaves it as it was: the parameters'
// gradients (restored in place where they existed), the stages' buffers (running statistics) and
// the RNG streams of the devices the input lives on.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "remat/chain/chain.h"

namespace remat {

/// A parameter or buffer of a chain with the name a report gives it.
struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};
/// Every distinct parameter of the chain's stages, named as Chain::stage_parameter_names gives it
/// (or "<stage>[k]" where the chain gives none), in stage order.
std::vector<NamedTensor> chain_parameters(const Chain& chain);
/// Every distinct buffer the chain's stages update (Chain::stage_buffers), named "<stage> buffer k".
std::vector<NamedTensor> chain_buffers(const Chain& chain);

class ChainStateGuard {
 public:
  ChainStateGuard(const Chain& chain, const at::Tensor& input);
  /// Any model's state: each tensor of `state` that requires grad is a parameter (its gradient
  /// kept), each other one a buffer (its values kept); the RNG streams of the devices they live on.
  explicit ChainStateGuard(const std::vector<at::Tensor>& state);
  ~ChainStateGuard();
  ChainStateGuard(const ChainStateGuard&) = delete;
  ChainStateGuard& operator=(const ChainStateGuard&) = delete;

  /// Puts the buffers back as they were on entry (also done on exit).
  void restore_buffers() const;
  /// Puts the RNG streams back as they were on entry (also done on exit).
  void restore_rng() const;

 private:
  struct Saved;
  std::unique_ptr<Saved> saved_;
};

}  // namespace remat
