// Internal: everything a measurement of a chain touches besides its result — parameter gradients,
// stage buffers (running statistics) and the RNG streams — saved on entry and put back on exit, so
// profiling, verifying or measuring a model leaves it as it was.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

#include "checkpoint/forward_state.h"
#include "remat/chain/chain.h"

namespace remat::detail {

/// Every distinct parameter of the chain's stages, with its name (stage_parameter_names, or
/// "<stage>[k]" where the chain gives none), in stage order.
struct NamedParameter {
  std::string name;
  at::Tensor tensor;
};
std::vector<NamedParameter> chain_parameters(const Chain& chain);
/// Every distinct buffer the chain's stages update, named "<stage> buffer k".
std::vector<NamedParameter> chain_buffers(const Chain& chain);

class ChainStateGuard {
 public:
  ChainStateGuard(const Chain& chain, const at::Tensor& input);
  ~ChainStateGuard();
  ChainStateGuard(const ChainStateGuard&) = delete;
  ChainStateGuard& operator=(const ChainStateGuard&) = delete;

  /// Puts the buffers back as they were on entry (also done on exit).
  void restore_buffers() const;
  const RngSnapshot& rng() const { return rng_; }

 private:
  std::vector<at::Tensor> parameters_, gradients_;  // undefined gradient: none on entry
  std::vector<at::Tensor> buffers_, buffer_copies_;
  RngSnapshot rng_;
};

}  // namespace remat::detail
