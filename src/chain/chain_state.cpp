#include "chain/chain_state.h"

#include <set>

#include <c10/core/GradMode.h>

namespace remat::detail {
namespace {

std::vector<NamedParameter> distinct(const Chain& chain, bool buffers) {
  std::vector<NamedParameter> out;
  std::set<const void*> seen;
  for (int64_t i = 0; i < chain.size(); ++i) {
    const auto tensors = buffers ? chain.stage_buffers(i) : chain.stage_parameters(i);
    const auto names = buffers ? std::vector<std::string>{} : chain.stage_parameter_names(i);
    for (size_t k = 0; k < tensors.size(); ++k) {
      if (!tensors[k].defined() || !seen.insert(tensors[k].unsafeGetTensorImpl()).second) continue;
      std::string name = k < names.size() ? names[k]
                                          : chain.stages()[i].name + (buffers ? " buffer " : "[") + std::to_string(k) +
                                                (buffers ? "" : "]");
      out.push_back({std::move(name), tensors[k]});
    }
  }
  return out;
}

}  // namespace

std::vector<NamedParameter> chain_parameters(const Chain& chain) { return distinct(chain, false); }
std::vector<NamedParameter> chain_buffers(const Chain& chain) { return distinct(chain, true); }

ChainStateGuard::ChainStateGuard(const Chain& chain, const at::Tensor& input) : rng_(RngSnapshot::capture({input})) {
  c10::NoGradGuard no_grad;
  for (const auto& p : chain_parameters(chain)) {
    parameters_.push_back(p.tensor);
    gradients_.push_back(p.tensor.grad().defined() ? p.tensor.grad().clone() : at::Tensor());
  }
  for (const auto& b : chain_buffers(chain)) {
    buffers_.push_back(b.tensor);
    buffer_copies_.push_back(b.tensor.clone());
  }
}

void ChainStateGuard::restore_buffers() const {
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].copy_(buffer_copies_[i]);
}

ChainStateGuard::~ChainStateGuard() {
  c10::NoGradGuard no_grad;
  restore_buffers();
  for (size_t i = 0; i < parameters_.size(); ++i) {
    at::Tensor& grad = parameters_[i].mutable_grad();
    if (!gradients_[i].defined()) {
      grad = at::Tensor();
    } else if (grad.defined() && grad.sizes() == gradients_[i].sizes()) {
      grad.copy_(gradients_[i]);  // in place: optimisers and hooks holding it see the same tensor
    } else {
      grad = gradients_[i];
    }
  }
  rng_.restore();
}

}  // namespace remat::detail
