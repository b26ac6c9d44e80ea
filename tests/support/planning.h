// Planning as the tests run it: one profiling repeat per stage, so that a profile takes
// milliseconds; everything else as make_plan's defaults.
#pragma once

#include "remat/autoplan/make_plan.h"

namespace remat::testing {

inline PlanningOptions quick_planning() {
  PlanningOptions options;
  options.profile().repeats(1);
  return options;
}

}  // namespace remat::testing
