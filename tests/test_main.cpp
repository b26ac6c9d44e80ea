// Test entry point: tests named *_CUDA run only where a CUDA device is present.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "remat/base/threads.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!at::hasCUDA()) {
    const std::string filter = ::testing::GTEST_FLAG(filter);
    ::testing::GTEST_FLAG(filter) = filter + (filter.find('-') == std::string::npos ? "-" : ":") + "*_CUDA";
  }
  at::set_num_threads(2);
  remat::set_thread_warning(false);  // arranged as LibTorch documents, on purpose; own_model_test checks the warning
  return RUN_ALL_TESTS();
}
