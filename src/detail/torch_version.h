// Internal: compile-time LibTorch version tests, for the few APIs that changed between 1.13 and 2.x.
#pragma once

#include <torch/version.h>

#define REMAT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
