// Test helpers shared by the checkpoint tests: an error's text, and the names of the two modes.
#pragma once

#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include "remat/checkpoint/checkpoint.h"

namespace remat::testing {

/// Runs `f`, expects a c10::Error whose text holds every fragment.
template <typename F>
void expect_error_containing(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    FAIL() << "expected a c10::Error";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    for (const auto& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos) << "'" << fragment << "' not in: " << message;
    }
  }
}

/// "reentrant" or "non_reentrant": the name of a test parameterised by the mode.
inline std::string checkpoint_mode_name(const ::testing::TestParamInfo<CheckpointMode>& info) {
  return info.param == CheckpointMode::reentrant ? "reentrant" : "non_reentrant";
}

}  // namespace remat::testing
