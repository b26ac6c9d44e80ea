// Internal: what differs between the LibTorch lines remat supports (1.13, 2.6 and 2.14 tested).
// Compile-time version tests, renamed or retyped calls, and the behaviour changes that need more
// than a renamed call, each with what changed and why remat answers it this way. The library's
// code outside this header and torch_compat.cpp tests no version. Templates and declarations, so
// this header includes nothing heavy: the caller has the LibTorch header the code needs.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/version.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#define REMAT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace at {
class Tensor;
}

namespace remat::detail {

// Autocast's state of one device (CPU or CUDA): 2.4 made the per-device calls (is_cpu_enabled,
// get_autocast_gpu_dtype, ...) one call taking the device.
bool autocast_enabled(c10::DeviceType device);
c10::ScalarType autocast_dtype(c10::DeviceType device);
void set_autocast(c10::DeviceType device, bool enabled, c10::ScalarType dtype);

// LibTorch's fused scaled-dot-product attention, from 2.1: whether it exists here, the backend it
// would choose (sdp::SDPBackend: -1 none, 0 math, which materialises the probabilities, above 0 a
// fused kernel; always -1 before 2.1) and the call (throws before 2.1).
constexpr bool kHasFusedAttention = REMAT_TORCH_AT_LEAST(2, 1);
int64_t fused_attention_backend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout,
                                bool causal, double scale);
at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout, bool causal,
                           double scale);

// A c10::Allocator written once: 2.3 took the const off allocate() and added the pure virtual
// copy_data(). `Derived` defines allocate_bytes(), reached without a second virtual call: every
// tensor allocation passes here.
template <typename Derived>
class AllocatorAcrossVersions : public c10::Allocator {
 public:
#if REMAT_TORCH_AT_LEAST(2, 3)
  c10::DataPtr allocate(size_t bytes) override { return static_cast<const Derived*>(this)->allocate_bytes(bytes); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
#else
  c10::DataPtr allocate(size_t bytes) const override {
    return static_cast<const Derived*>(this)->allocate_bytes(bytes);
  }
#endif
};

// How autograd holds its graph's nodes: std::shared_ptr<Node> up to 2.1x, c10::intrusive_ptr<Node>
// since (Edge::function, grad_fn(), the gradient accumulators). Code that keeps or makes a node
// names this type, not either pointer.
template <typename Edge>
using NodePointer = decltype(std::declval<Edge&>().function);

template <typename T>
struct IsSharedPtr : std::false_type {};
template <typename T>
struct IsSharedPtr<std::shared_ptr<T>> : std::true_type {};

// A new node of type `NodeT`, held as autograd holds nodes.
template <typename NodeT, typename Edge>
NodePointer<Edge> make_node() {
  if constexpr (IsSharedPtr<NodePointer<Edge>>::value) {
    return std::make_shared<NodeT>();
  } else {
    return c10::make_intrusive<NodeT>();
  }
}

// Runs `run()` with the tensor pre-hooks (and retains_grad hooks) of the autograd nodes `nodes`
// set aside, then puts them back, ahead of any a hook added meanwhile.
//
// Why: from 2.0 the engine runs a node's tensor pre-hooks when it captures a gradient there
// (torch::autograd::grad fires its inputs' hooks, as Python's does), and a leaf's hooks live on its
// AccumulateGrad. A reentrant checkpoint's backward captures its parameters' gradients in an inner
// engine run, then hands them to the outer backward, which fires the same hooks again: every
// parameter hook ran twice, and a hook that changes the gradient applied twice. 1.13's engine did
// not fire hooks at a capture; with them set aside, 2.x behaves the same.
template <typename NodePointers, typename Run>
decltype(auto) run_with_capture_hooks_aside(const NodePointers& nodes, Run&& run) {
#if REMAT_TORCH_AT_LEAST(2, 0)
  using Node = std::remove_reference_t<decltype(**nodes.begin())>;
  using PreHooks = std::remove_reference_t<decltype(std::declval<Node&>().tensor_pre_hooks())>;
  using RetainsGradHooks = std::remove_reference_t<decltype(std::declval<Node&>().retains_grad_hooks())>;
  struct Aside {
    Node* node;
    PreHooks pre_hooks;
    RetainsGradHooks retains_grad_hooks;
  };
  struct Restore {
    std::vector<Aside> aside;
    ~Restore() {
      for (auto it = aside.rbegin(); it != aside.rend(); ++it) {
        PreHooks& now = it->node->tensor_pre_hooks();
        for (auto& added : now) it->pre_hooks.push_back(std::move(added));
        now = std::move(it->pre_hooks);
        RetainsGradHooks& retains = it->node->retains_grad_hooks();
        for (auto& added : retains) it->retains_grad_hooks[added.first] = std::move(added.second);
        retains = std::move(it->retains_grad_hooks);
      }
    }
  } restore;
  for (Node* node : nodes) {
    bool seen = false;
    for (const Aside& a : restore.aside) seen = seen || a.node == node;
    if (seen || node == nullptr) continue;
    restore.aside.push_back({node, std::move(node->tensor_pre_hooks()), std::move(node->retains_grad_hooks())});
    node->tensor_pre_hooks().clear();
    node->retains_grad_hooks().clear();
  }
  return run();
#else
  (void)nodes;
  return run();
#endif
}

// Sets up a c10d::TCPStoreOptions for the store c10d built in every version: from 2.4 the options
// default to the libuv backend (useLibUV, a member only 2.x has), which Debian's LibTorch 2.x is
// built without, so the store refused to start ("use_libuv was requested but PyTorch was build
// without libuv support"). Detected by the member, not the version: any 2.x that has it.
template <typename StoreOptions, typename = void>
struct HasUseLibUV : std::false_type {};
template <typename StoreOptions>
struct HasUseLibUV<StoreOptions, std::void_t<decltype(std::declval<StoreOptions&>().useLibUV)>> : std::true_type {};

template <typename StoreOptions>
void use_classic_tcp_store_backend(StoreOptions& options) {
  if constexpr (HasUseLibUV<StoreOptions>::value) options.useLibUV = false;
}

}  // namespace remat::detail
