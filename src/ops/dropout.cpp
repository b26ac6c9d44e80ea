#include "remat/ops/dropout.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ge.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/custom_function.h>

#include "ops/philox_keep.h"
#include "remat/base/error.h"

namespace remat::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Elements per parallel chunk: each chunk starts its own engine, so chunks need not be aligned.
constexpr int64_t kGrain = 1 << 14;

// The device path draws a flat tensor's mask as rows of this many elements: rows are what
// keep_decisions groups to bound its transients.
constexpr int64_t kDeviceRow = 4096;

// The keep decisions of elements 0 .. n-1 of the stream, drawn on `device`: (n) bool.
at::Tensor keep_decisions_on(c10::Device device, uint64_t seed, int64_t n, double p) {
  const int64_t rows = (n + kDeviceRow - 1) / kDeviceRow;
  const at::Tensor starts = at::arange(rows, at::TensorOptions().dtype(at::kLong).device(device)).mul_(kDeviceRow);
  return detail::keep_decisions(seed, starts, kDeviceRow, detail::keep_threshold(p)).view({-1}).narrow(0, 0, n);
}

// t (contiguous, CPU) with the mask applied in place.
void apply_mask_(at::Tensor& t, uint64_t seed, double p) {
  const uint64_t threshold = detail::keep_threshold(p);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t.scalar_type(), "remat::ops::dropout", [&] {
    scalar_t* data = t.data_ptr<scalar_t>();
    const scalar_t scale = static_cast<scalar_t>(1.0 / (1.0 - p));
    at::parallel_for(0, t.numel(), kGrain, [&](int64_t begin, int64_t end) {
      detail::apply_keep(data + begin, seed, static_cast<uint64_t>(begin), end - begin, threshold, scale);
    });
  });
}

// x times the mask, as a new contiguous tensor. `differentiable`: through ATen ops autograd records
// (for double backward) instead of the in-place kernel. Off the CPU the mask is drawn on x's device;
// both paths give the same bits: dropped elements +0 (whatever x holds there, NaN included), kept
// ones x·scale with the scale rounded to x's dtype first.
at::Tensor masked(const at::Tensor& x, uint64_t seed, double p, bool differentiable) {
  if (!detail::keeps_by_tensor_ops(x)) {
    if (differentiable) return x.mul(dropout_scale(seed, x.sizes(), p, x.scalar_type()));
    at::Tensor out = x.clone(at::MemoryFormat::Contiguous);
    apply_mask_(out, seed, p);
    return out;
  }
  const at::Tensor keep = keep_decisions_on(x.device(), seed, x.numel(), p).view(x.sizes());
  const at::Tensor scale = at::scalar_tensor(1.0 / (1.0 - p), x.options());
  if (differentiable) return x.mul(at::where(keep, scale, at::zeros({}, x.options())));
  at::Tensor out = at::empty(x.sizes(), x.options());
  at::mul_out(out, x, scale);
  return out.masked_fill_(keep.logical_not(), 0);
}

struct RegeneratedDropout : torch::autograd::Function<RegeneratedDropout> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, double p) {
    const uint64_t seed = draw_dropout_seed();
    ctx->saved_data["seed"] = static_cast<int64_t>(seed);
    ctx->saved_data["p"] = p;
    return {masked(x, seed, p, /*differentiable=*/false)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto seed = static_cast<uint64_t>(ctx->saved_data["seed"].toInt());
    const double p = ctx->saved_data["p"].toDouble();
    return {masked(grads[0], seed, p, /*differentiable=*/at::GradMode::is_enabled()), at::Tensor()};
  }
};

}  // namespace

namespace detail {
namespace {

// Philox4x32-10's constants (ATen's PhiloxRNGEngine.h).
constexpr uint32_t kPhiloxSA = 0xD2511F53, kPhiloxSB = 0xCD9E8D57;
constexpr uint32_t kPhilox10A = 0x9E3779B9, kPhilox10B = 0xBB67AE85;
constexpr int kRounds = 10;
constexpr int64_t kLow32 = 0xFFFFFFFF;
// keep_decisions draws at most this many elements at once: ~16 MiB of int64 transients, and one
// group for a block of attention's probabilities (2^19 scores).
constexpr int64_t kElementsPerGroup = int64_t{1} << 19;

std::atomic<int> forced{0};

// A (2, 1, 1) int64 tensor holding (first, second), made on the device rather than copied there.
at::Tensor pair(int64_t first, int64_t second, const at::TensorOptions& options) {
  return at::arange(2, options).mul_(second - first).add_(first).view({2, 1, 1});
}

// The high and low 32 bits of m·x, for 32-bit values x (int64) and per-row 32-bit multipliers m
// given as 16-bit halves: a 32x32-bit product overflows int64, but x·m_high and x·m_low (< 2⁴⁸)
// and their recombination (< 2⁴⁹) do not.
std::pair<at::Tensor, at::Tensor> mulhilo(const at::Tensor& x, const at::Tensor& m_low, const at::Tensor& m_high) {
  const at::Tensor low = x.mul(m_low);
  at::Tensor high = x.mul(m_high);                                              // m·x = high·2¹⁶ + low
  at::Tensor rest = high.bitwise_and(0xFFFF).mul_(int64_t{1} << 16).add_(low);  // m·x = (high >> 16)·2³² + rest
  high.bitwise_right_shift_(16).add_(rest.bitwise_right_shift(32));
  return {high, rest.bitwise_and_(kLow32)};
}

}  // namespace

at::Tensor philox_outputs(uint64_t seed, const at::Tensor& starts, int64_t length) {
  REMAT_CHECK(starts.dim() == 1 && starts.scalar_type() == at::kLong && length >= 0,
              "philox_outputs: takes one dimension of int64 starts and a length >= 0.");
  const at::TensorOptions options = starts.options();
  // A row of `length` elements from any lane of its first counter spans this many counters.
  const int64_t counters = (length + 2) / 4 + 1;
  const at::Tensor counter = starts.bitwise_right_shift(2).unsqueeze(1).add(at::arange(counters, options));
  // The state (c0, c1, c2, c3) as the words a round multiplies, (c0, c2), and the words it passes
  // on, (c1, c3): each pair one (2, rows, counters) tensor, so that a round is one pass over each.
  // The 64-bit counter is (c0, c1); subsequence 0 makes c2 = c3 = 0.
  const at::Tensor zero = at::zeros_like(counter);
  at::Tensor multiplied = at::stack({counter.bitwise_and(kLow32), zero});
  at::Tensor passed = at::stack({counter.bitwise_right_shift(32), zero});
  const at::Tensor m_low = pair(kPhiloxSA & 0xFFFF, kPhiloxSB & 0xFFFF, options);
  const at::Tensor m_high = pair(kPhiloxSA >> 16, kPhiloxSB >> 16, options);
  auto key0 = static_cast<uint32_t>(seed), key1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < kRounds; ++round) {
    auto [hi, lo] = mulhilo(multiplied, m_low, m_high);  // (hi0, hi1), (lo0, lo1)
    // c0' = hi1 ^ c1 ^ k0, c2' = hi0 ^ c3 ^ k1, c1' = lo1, c3' = lo0.
    multiplied = hi.flip({0}).bitwise_xor_(passed);
    multiplied[0].bitwise_xor_(static_cast<int64_t>(key0));
    multiplied[1].bitwise_xor_(static_cast<int64_t>(key1));
    passed = lo.flip({0});
    key0 += kPhilox10A;  // wraps at 2³², as the engine's key does
    key1 += kPhilox10B;
  }
  // Outputs in lane order c0, c1, c2, c3, then each row's window from its first element's lane.
  const at::Tensor outputs =
      at::stack({multiplied[0], passed[0], multiplied[1], passed[1]}, 2).view({starts.size(0), 4 * counters});
  return outputs.gather(1, starts.bitwise_and(3).unsqueeze(1).add(at::arange(length, options)));
}

at::Tensor keep_decisions(uint64_t seed, const at::Tensor& starts, int64_t length, uint64_t threshold) {
  at::Tensor keep = at::empty({starts.size(0), length}, starts.options().dtype(at::kBool));
  const int64_t group = std::max<int64_t>(1, kElementsPerGroup / std::max<int64_t>(length, 1));
  for (int64_t row = 0; row < starts.size(0); row += group) {
    const int64_t rows = std::min(group, starts.size(0) - row);
    at::Tensor decided = keep.narrow(0, row, rows);
    at::ge_out(decided, philox_outputs(seed, starts.narrow(0, row, rows), length), static_cast<int64_t>(threshold));
  }
  return keep;
}

bool keeps_by_tensor_ops(const at::Tensor& t) { return !t.device().is_cpu() || forced.load() > 0; }

ForceTensorKeepPath::ForceTensorKeepPath() { ++forced; }
ForceTensorKeepPath::~ForceTensorKeepPath() { --forced; }

}  // namespace detail

uint64_t draw_dropout_seed() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return at::check_generator<at::CPUGeneratorImpl>(generator)->random64();
}

at::Tensor dropout_scale(uint64_t seed, c10::IntArrayRef sizes, double p, at::ScalarType dtype) {
  REMAT_CHECK(at::isFloatingType(dtype), "remat::ops::dropout_scale: the dtype must be floating-point.");
  at::Tensor scale = at::empty(sizes, at::TensorOptions().dtype(dtype));
  const uint64_t threshold = detail::keep_threshold(p);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "remat::ops::dropout_scale", [&] {
    const scalar_t kept = static_cast<scalar_t>(1.0 / (1.0 - p));
    scalar_t* data = scale.data_ptr<scalar_t>();
    at::parallel_for(0, scale.numel(), kGrain, [&](int64_t begin, int64_t end) {
      detail::for_each_keep(seed, static_cast<uint64_t>(begin), end - begin, threshold,
                            [&](int64_t i, bool keep) { data[begin + i] = keep ? kept : scalar_t(0); });
    });
  });
  return scale;
}

at::Tensor apply_dropout_mask(const at::Tensor& x, uint64_t seed, double p) {
  REMAT_CHECK(x.defined() && at::isFloatingType(x.scalar_type()),
              "remat::ops::apply_dropout_mask: takes a floating-point tensor.");
  return masked(x, seed, p, /*differentiable=*/false);
}

at::Tensor dropout(const at::Tensor& x, double p, bool training) {
  REMAT_CHECK(x.defined() && at::isFloatingType(x.scalar_type()),
              "remat::ops::dropout: takes a floating-point tensor, got ",
              x.defined() ? toString(x.scalar_type()) : "none", ".");
  detail::keep_threshold(p);  // checks p
  if (!training || p == 0.0) return x;
  return RegeneratedDropout::apply(x, p)[0];
}

}  // namespace remat::ops
