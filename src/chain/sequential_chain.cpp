#include "remat/chain/sequential_chain.h"

#include <algorithm>
#include <cctype>
#include <numeric>
#include <optional>

#include "remat/base/error.h"

namespace remat {
namespace {

// "torch::nn::Conv2dImpl" -> "conv2d": what a stage made of one module is called, with its key.
std::string short_type_name(const std::string& name) {
  std::string type = name.substr(name.rfind(':') == std::string::npos ? 0 : name.rfind(':') + 1);
  if (type.size() > 4 && type.compare(type.size() - 4, 4, "Impl") == 0) type.resize(type.size() - 4);
  std::string out;
  for (char c : type) {
    if (std::isalnum(static_cast<unsigned char>(c)))
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out.empty() ? "module" : out;
}

std::string stage_name_of(const std::string& key, const torch::nn::Module& module) {
  const bool numeric = !key.empty() && std::all_of(key.begin(), key.end(),
                                                   [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  return numeric ? short_type_name(module.name()) + key : key;
}

std::string shape_of(const at::Tensor& t) {
  std::string out = "[";
  for (int64_t d = 0; d < t.dim(); ++d) out += (d ? ", " : "") + std::to_string(t.size(d));
  return out + "]";
}

std::vector<std::pair<std::string, torch::nn::AnyModule>> named_modules_of(const torch::nn::Sequential& sequential) {
  REMAT_CHECK(!sequential.is_empty(),
              "SequentialChain: the Sequential is an empty holder (nullptr); construct it first.");
  std::vector<std::pair<std::string, torch::nn::AnyModule>> out;
  const auto children = sequential->named_children();
  size_t i = 0;
  for (const auto& module : *sequential) out.emplace_back(children[i++].key(), module);
  return out;
}

}  // namespace

SequentialChain::SequentialChain(const torch::nn::Sequential& sequential, LossFunction loss,
                                 const SequentialChainOptions& options)
    : SequentialChain(named_modules_of(sequential), std::move(loss), options) {}

SequentialChain::SequentialChain(const std::vector<std::pair<std::string, torch::nn::AnyModule>>& modules,
                                 LossFunction loss, const SequentialChainOptions& options)
    : loss_(std::move(loss)) {
  const auto n = static_cast<int64_t>(modules.size());
  REMAT_CHECK(n > 0, "SequentialChain: the model has no modules; give it at least one.");
  std::vector<int64_t> sizes = options.group_sizes();
  if (sizes.empty()) sizes.assign(n, 1);
  REMAT_CHECK(std::all_of(sizes.begin(), sizes.end(), [](int64_t s) { return s >= 1; }) &&
                  std::accumulate(sizes.begin(), sizes.end(), int64_t{0}) == n,
              "SequentialChainOptions::group_sizes must be positive and sum to the number of modules (", n, ").");
  granularity_ = "modules";
  if (std::any_of(sizes.begin(), sizes.end(), [](int64_t s) { return s != 1; })) {
    granularity_ += ":";
    for (size_t g = 0; g < sizes.size(); ++g) granularity_ += (g ? "+" : "") + std::to_string(sizes[g]);
  }
  int64_t next = 0;
  for (const int64_t size : sizes) {
    Stage stage;
    std::vector<torch::nn::AnyModule> group;
    std::vector<std::string> names;
    for (int64_t i = next; i < next + size; ++i) {
      const auto& [key, module] = modules[i];
      REMAT_CHECK(!module.is_empty(), "SequentialChain: module '", key, "' is empty.");
      group.push_back(module);
      stage.module_names.push_back(key);
      stage.stage.modules.push_back(module.ptr());
      names.push_back(stage_name_of(key, *module.ptr()));
    }
    next += size;
    stage.stage.name = names.front() + (names.size() > 1 ? "-" + names.back() : "");
    stage.stage.forward = [group, keys = stage.module_names](const at::Tensor& input, const std::string&) mutable {
      at::Tensor x = input;
      for (size_t m = 0; m < group.size(); ++m) {
        std::optional<torch::nn::AnyValue> value;
        try {
          value.emplace(group[m].any_forward(x));
        } catch (const c10::Error& e) {
          REMAT_CHECK(false, "SequentialChain: module '", keys[m], "' (", group[m].ptr()->name(),
                      ") cannot run on one tensor of shape ", shape_of(x), ": ", e.what_without_backtrace());
        }
        REMAT_CHECK(value->type_info() == typeid(at::Tensor), "SequentialChain: module '", keys[m], "' (",
                    group[m].ptr()->name(), ") returned something other than one tensor (", value->type_info().name(),
                    "); wrap it in a module or a SequentialStage that returns one tensor.");
        x = value->get<at::Tensor>();
      }
      return x;
    };
    stages_.push_back(std::move(stage));
  }
  rebuild_infos();
}

SequentialChain::SequentialChain(std::vector<SequentialStage> stages, LossFunction loss)
    : loss_(std::move(loss)), granularity_("stages") {
  REMAT_CHECK(!stages.empty(), "SequentialChain: no stages; give at least one.");
  for (auto& s : stages) {
    REMAT_CHECK(static_cast<bool>(s.forward), "SequentialChain: stage '", s.name, "' has no forward function.");
    REMAT_CHECK(!s.options.empty(), "SequentialChain: stage '", s.name, "' lists no options; give at least one.");
    Stage stage;
    for (size_t m = 0; m < s.modules.size(); ++m) stage.module_names.push_back(s.name + "." + std::to_string(m));
    stage.stage = std::move(s);
    stages_.push_back(std::move(stage));
  }
  rebuild_infos();
}

void SequentialChain::rebuild_infos() {
  infos_.clear();
  for (size_t i = 0; i < stages_.size(); ++i) {
    const auto& s = stages_[i].stage;
    REMAT_CHECK(!loss_ || s.name != "loss",
                "SequentialChain: a stage is named 'loss', the name of the loss stage; rename it.");
    for (const auto& other : infos_) {
      REMAT_CHECK(other.name != s.name, "SequentialChain: two stages are named '", s.name, "'; names must be unique.");
    }
    infos_.push_back({s.name, static_cast<int64_t>(i), s.options});
  }
  if (loss_) infos_.push_back({"loss", -1, {"full"}});
}

void SequentialChain::set_loss(LossFunction loss) {
  loss_ = std::move(loss);
  rebuild_infos();
}

at::Tensor SequentialChain::forward_stage(int64_t index, const at::Tensor& input, const std::string& option) {
  REMAT_CHECK(index >= 0 && index < size(), "SequentialChain: stage ", index, " out of range [0, ", size(), ").");
  if (index == static_cast<int64_t>(stages_.size())) {
    at::Tensor loss = loss_(input);
    REMAT_CHECK(loss.defined() && loss.numel() == 1, "SequentialChain: the loss function must return a scalar ",
                "(one element), got ", loss.defined() ? "shape " + shape_of(loss) : std::string("an undefined tensor"),
                "; reduce it, e.g. with .mean().");
    return loss;
  }
  const auto& options = infos_[index].options;
  REMAT_CHECK(std::find(options.begin(), options.end(), option) != options.end(), "SequentialChain: stage '",
              infos_[index].name, "' has no option '", option, "'.");
  return stages_[index].stage.forward(input, option);
}

at::Tensor SequentialChain::forward(const at::Tensor& input) {
  at::Tensor x = input;
  for (int64_t i = 0; i < static_cast<int64_t>(stages_.size()); ++i) x = forward_stage(i, x, infos_[i].options.front());
  return x;
}

std::vector<at::Tensor> SequentialChain::stage_parameters(int64_t index) const {
  std::vector<at::Tensor> out;
  if (index >= static_cast<int64_t>(stages_.size())) return out;
  for (const auto& m : stages_[index].stage.modules) {
    for (const auto& p : m->parameters()) out.push_back(p);
  }
  return out;
}

std::vector<std::string> SequentialChain::stage_parameter_names(int64_t index) const {
  std::vector<std::string> out;
  if (index >= static_cast<int64_t>(stages_.size())) return out;
  const auto& stage = stages_[index];
  for (size_t m = 0; m < stage.stage.modules.size(); ++m) {
    for (const auto& p : stage.stage.modules[m]->named_parameters())
      out.push_back(stage.module_names[m] + "." + p.key());
  }
  return out;
}

std::string SequentialChain::stage_signature(int64_t index) const {
  if (index >= static_cast<int64_t>(stages_.size()) || granularity_ == "stages") return {};
  std::string signature;
  for (const auto& m : stages_[index].stage.modules) {
    signature += m->name() + "(";
    for (const auto& p : m->named_parameters()) signature += p.key() + shape_of(p.value());
    for (const auto& b : m->named_buffers()) signature += b.key() + shape_of(b.value());
    signature += ")";
  }
  return signature;
}

std::vector<at::Tensor> SequentialChain::stage_buffers(int64_t index) const {
  std::vector<at::Tensor> out;
  if (index >= static_cast<int64_t>(stages_.size())) return out;
  for (const auto& m : stages_[index].stage.modules) {
    if (!m->is_training()) continue;  // in evaluation mode nothing updates them
    for (const auto& b : m->buffers()) out.push_back(b);
  }
  return out;
}

}  // namespace remat
