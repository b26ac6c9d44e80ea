#include "remat/checkpoint/selective.h"

#include <algorithm>
#include <memory>
#include <unordered_set>

#include <ATen/core/dispatch/Dispatcher.h>

#include "remat/base/error.h"

namespace remat {

namespace {

// Matrix products as kernels see them (linear and matmul decompose into these).
const std::vector<std::string>& matrix_product_operators() {
  static const std::vector<std::string> names = {
      "aten::mm",      "aten::addmm",      "aten::bmm",    "aten::baddbmm", "aten::addbmm",
      "aten::mv",      "aten::addmv",      "aten::dot",    "aten::vdot",    "aten::_addmm_activation",
      "aten::_int_mm", "aten::_scaled_mm", "aten::linear", "aten::matmul",  "aten::mkldnn_linear"};
  return names;
}

const std::vector<std::string>& convolution_and_attention_operators() {
  static const std::vector<std::string> names = {"aten::convolution",
                                                 "aten::_convolution",
                                                 "aten::convolution_overrideable",
                                                 "aten::mkldnn_convolution",
                                                 "aten::cudnn_convolution",
                                                 "aten::miopen_convolution",
                                                 "aten::_slow_conv2d_forward",
                                                 "aten::slow_conv3d_forward",
                                                 "aten::_scaled_dot_product_flash_attention",
                                                 "aten::_scaled_dot_product_flash_attention_for_cpu",
                                                 "aten::_scaled_dot_product_efficient_attention",
                                                 "aten::_scaled_dot_product_cudnn_attention",
                                                 "aten::_flash_attention_forward",
                                                 "aten::_efficient_attention_forward",
                                                 "aten::_native_multi_head_attention"};
  return names;
}

using NameSet = std::unordered_set<std::string_view>;

std::shared_ptr<const NameSet> set_of(const std::vector<std::string>& a, const std::vector<std::string>& b = {}) {
  auto names = std::make_shared<NameSet>();
  for (const auto& n : a) names->insert(n);
  for (const auto& n : b) names->insert(n);
  return names;
}

}  // namespace

const char* to_string(CheckpointPolicy policy) {
  switch (policy) {
    case CheckpointPolicy::must_save:
      return "must_save";
    case CheckpointPolicy::prefer_save:
      return "prefer_save";
    case CheckpointPolicy::must_recompute:
      return "must_recompute";
    case CheckpointPolicy::prefer_recompute:
      return "prefer_recompute";
  }
  return "unknown";
}

const std::vector<std::string>& compute_intensive_operators() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all = matrix_product_operators();
    const auto& more = convolution_and_attention_operators();
    all.insert(all.end(), more.begin(), more.end());
    return all;
  }();
  return names;
}

SelectivePolicy save_compute_intensive() {
  // The set lives as long as any copy of the policy; the names point into static strings.
  std::shared_ptr<const NameSet> keep = set_of(compute_intensive_operators());
  return [keep](const OperatorCall& call) {
    return keep->count(call.name) != 0 ? CheckpointPolicy::prefer_save : CheckpointPolicy::prefer_recompute;
  };
}

SelectivePolicy save_every_other_matmul() {
  std::shared_ptr<const NameSet> products = set_of(matrix_product_operators());
  std::shared_ptr<const NameSet> always = set_of(convolution_and_attention_operators());
  return [products, always](const OperatorCall& call) {
    if (always->count(call.name) != 0) return CheckpointPolicy::prefer_save;
    if (products->count(call.name) != 0 && call.name_index % 2 == 0) return CheckpointPolicy::prefer_save;
    return CheckpointPolicy::prefer_recompute;
  };
}

SelectivePolicy save_operators(std::vector<std::string> names) {
  std::unordered_set<std::string> known;  // "ns::op" and "ns::op.overload", of every registered operator
  for (const c10::OperatorName& op : c10::Dispatcher::singleton().getAllOpNames()) {
    known.insert(op.name);
    if (!op.overload_name.empty()) known.insert(op.name + "." + op.overload_name);
  }
  for (const auto& name : names) {
    REMAT_CHECK(name.find("::") != std::string::npos && name.find("::") > 0, "save_operators: '", name.substr(0, 80),
                "' is not an operator name; name operators as kernels see them, with their namespace: "
                "\"aten::mm\", or \"aten::add.Tensor\" for one overload.");
    REMAT_CHECK(known.count(name) != 0, "save_operators: no operator is named '", name.substr(0, 80),
                "' (a typo would keep nothing). Name operators as kernels see them: \"aten::mm\", \"aten::addmm\", "
                "\"aten::add.Tensor\"; an operator of your own must be registered before the policy is made.");
  }
  auto owned = std::make_shared<std::vector<std::string>>(std::move(names));
  auto keep = std::make_shared<NameSet>();
  for (const auto& n : *owned) keep->insert(n);
  return [owned, keep](const OperatorCall& call) {
    if (keep->count(call.name) != 0) return CheckpointPolicy::prefer_save;
    if (!call.overload.empty()) {
      std::string full(call.name);
      full.append(".").append(call.overload);
      if (keep->count(full) != 0) return CheckpointPolicy::prefer_save;
    }
    return CheckpointPolicy::prefer_recompute;
  };
}

std::vector<std::string> selective_policy_names() { return {"compute-intensive", "every-other-matmul"}; }

SelectivePolicy selective_policy(const std::string& name) {
  if (name == "compute-intensive") return save_compute_intensive();
  if (name == "every-other-matmul") return save_every_other_matmul();
  REMAT_CHECK(false, "unknown selective policy '", name.substr(0, 80),
              "'; use compute-intensive (keep matrix products, convolutions and attention, recompute the rest) "
              "or every-other-matmul (torchtitan's: keep every other matrix product).");
  return nullptr;
}

}  // namespace remat
