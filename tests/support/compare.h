// Test helpers: run a model twice (plain and checkpointed) from the same seed and compare.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/nn/module.h>

namespace remat::testing {

/// Gradients of all parameters of `module`, by name, cloned; undefined grads stay undefined.
inline std::vector<std::pair<std::string, at::Tensor>> parameter_grads(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> grads;
  for (const auto& p : module.named_parameters()) {
    grads.emplace_back(p.key(), p.value().grad().defined() ? p.value().grad().clone() : at::Tensor());
  }
  return grads;
}

/// Bitwise equality of two tensors (same shape, dtype, values), with a readable failure.
inline ::testing::AssertionResult bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined()) {
    if (a.defined() == b.defined()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "one tensor is undefined";
  }
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) {
    return ::testing::AssertionFailure() << "shapes/dtypes differ: " << a.sizes() << " vs " << b.sizes();
  }
  if (a.equal(b)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max abs difference " << (a - b).abs().max().item<double>();
}

// The bits of t as integers of its element size: unlike equal(), tells -0 from +0.
inline at::Tensor bits_of(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  switch (c.element_size()) {
    case 2:
      return c.view(torch::kShort);
    case 4:
      return c.view(torch::kInt);
    default:
      return c.view(torch::kLong);
  }
}

/// Equal bit for bit (-0 is not +0), except that any NaN equals any NaN.
inline ::testing::AssertionResult same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) {
    return ::testing::AssertionFailure() << "shapes/dtypes differ: " << a.sizes() << " vs " << b.sizes();
  }
  // Any NaN equals any NaN: its payload is the multiply's (vectorised or not, CPU or GPU), not the mask's.
  const at::Tensor x = a.cpu(), y = b.cpu();
  const at::Tensor differ = bits_of(x).ne(bits_of(y)).logical_and_(x.isnan().logical_and(y.isnan()).logical_not());
  if (!differ.any().item<bool>()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << differ.sum().item<int64_t>() << " of " << a.numel() << " elements differ";
}

inline void expect_same_grads(const std::vector<std::pair<std::string, at::Tensor>>& expected,
                              const std::vector<std::pair<std::string, at::Tensor>>& actual) {
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(expected[i].first, actual[i].first);
    ASSERT_TRUE(expected[i].second.defined()) << expected[i].first << " has no gradient in the plain run";
    EXPECT_TRUE(bitwise_equal(expected[i].second, actual[i].second)) << "parameter " << expected[i].first;
  }
}

/// The message of the c10::Error `f` throws, or "no error".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "no error";
}

}  // namespace remat::testing

/// Expects `statement` to throw a c10::Error whose message contains `fragment`.
#define REMAT_EXPECT_ERROR(statement, fragment)                                \
  do {                                                                         \
    const std::string message_ = remat::testing::error_of([&] { statement; }); \
    EXPECT_NE(message_.find(fragment), std::string::npos) << message_;         \
  } while (0)
