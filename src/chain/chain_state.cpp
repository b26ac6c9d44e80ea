#include "remat/chain/chain_state.h"

#include <set>

#include <c10/core/GradMode.h>

#include "checkpoint/forward_state.h"

namespace remat {
namespace {

std::vector<NamedTensor> distinct(const Chain& chain, bool buffers) {
  std::vector<NamedTensor> out;
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

std::vector<NamedTensor> chain_parameters(const Chain& chain) { return distinct(chain, false); }
std::vector<NamedTensor> chain_buffers(const Chain& chain) { return distinct(chain, true); }

struct ChainStateGuard::Saved {
  std::vector<at::Tensor> parameters, gradients;  // undefined gradient: none on entry
  std::vector<at::Tensor> buffers, buffer_copies;
  detail::RngSnapshot rng;
};

ChainStateGuard::ChainStateGuard(const Chain& chain, const at::Tensor& input)
    : saved_(new Saved{{}, {}, {}, {}, detail::RngSnapshot::capture({input})}) {
  c10::NoGradGuard no_grad;
  for (const auto& p : chain_parameters(chain)) {
    saved_->parameters.push_back(p.tensor);
    saved_->gradients.push_back(p.tensor.grad().defined() ? p.tensor.grad().clone() : at::Tensor());
  }
  for (const auto& b : chain_buffers(chain)) {
    saved_->buffers.push_back(b.tensor);
    saved_->buffer_copies.push_back(b.tensor.clone());
  }
}

ChainStateGuard::ChainStateGuard(const std::vector<at::Tensor>& state)
    : saved_(new Saved{{}, {}, {}, {}, detail::RngSnapshot::capture(state)}) {
  c10::NoGradGuard no_grad;
  for (const at::Tensor& t : state) {
    if (t.requires_grad()) {
      saved_->parameters.push_back(t);
      saved_->gradients.push_back(t.grad().defined() ? t.grad().clone() : at::Tensor());
    } else {
      saved_->buffers.push_back(t);
      saved_->buffer_copies.push_back(t.clone());
    }
  }
}

void ChainStateGuard::restore_buffers() const {
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < saved_->buffers.size(); ++i) saved_->buffers[i].copy_(saved_->buffer_copies[i]);
}

void ChainStateGuard::restore_rng() const { saved_->rng.restore(); }

ChainStateGuard::~ChainStateGuard() {
  c10::NoGradGuard no_grad;
  restore_buffers();
  for (size_t i = 0; i < saved_->parameters.size(); ++i) {
    at::Tensor& grad = saved_->parameters[i].mutable_grad();
    const at::Tensor& before = saved_->gradients[i];
    if (!before.defined()) {
      grad = at::Tensor();
    } else if (grad.defined() && grad.sizes() == before.sizes()) {
      grad.copy_(before);  // in place: optimisers and hooks holding it see the same tensor
    } else {
      grad = before;
    }
  }
  restore_rng();
}

}  // namespace remat
