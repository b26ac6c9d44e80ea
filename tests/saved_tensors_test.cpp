// remat/checkpoint/saved_tensors.h: what a forward saves, counted, dropped or stopped at.
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/checkpoint/saved_tensors.h"
#include "support/compare.h"

using remat::testing::bitwise_equal;

// What a forward saves, seen from outside: x·w saves both factors, exp its result.
TEST(SavedTensors, AreCountedDroppedOrStoppedAtAsAskedFor) {
  const at::Tensor x = torch::randn({5}, torch::requires_grad());
  const at::Tensor w = torch::randn({5}, torch::requires_grad());
  bool past_product = false;
  at::Tensor y;
  auto forward = [&] {
    const at::Tensor product = x * w;
    past_product = true;
    y = product.exp();
  };
  EXPECT_EQ(remat::count_saved_tensors(forward), 3u);
  REMAT_EXPECT_ERROR(y.sum().backward(), "keeps no saved tensors");

  past_product = false;
  const std::vector<at::Tensor> kept = remat::run_until_saved(forward, 2);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_FALSE(past_product) << "abandoned at the second saved tensor";
  EXPECT_TRUE(bitwise_equal(kept[0] * kept[1], (x * w).detach()));
  EXPECT_TRUE(remat::run_until_saved(forward, 0).empty());
  EXPECT_EQ(remat::run_until_saved(forward, 10).size(), 3u) << "a forward saving fewer runs to its end";
  EXPECT_TRUE(past_product);

  remat::run_without_saving(forward);
  EXPECT_TRUE(bitwise_equal(y, (x * w).exp())) << "the forward computes as usual";
  ASSERT_TRUE(y.requires_grad()) << "its graph is recorded";
  EXPECT_THROW(y.sum().backward(), c10::Error);
}
