// Internal: what the two checkpoint modes share with the public entry points (checkpoint.cpp):
// the prefix of their error messages, the check of a function's outputs, and each mode's
// `checkpoint` under grad mode (checkpoint_reentrant.cpp, checkpoint_non_reentrant.cpp).
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "remat/checkpoint/checkpoint.h"

namespace remat::detail {

/// "checkpoint 'NAME': ", the start of every error message about checkpoint NAME.
std::string describe_input_use(const std::string& name);

/// Refuses a function that returned no defined tensor.
void check_outputs(const std::vector<at::Tensor>& outputs, const std::string& name);

/// checkpoint() in reentrant mode, grad enabled, arguments checked (checkpoint_reentrant.cpp).
std::vector<at::Tensor> checkpoint_reentrant(const TensorListFunction& fn, const std::vector<at::Tensor>& inputs,
                                             const CheckpointOptions& options);

/// checkpoint() in non-reentrant mode, grad enabled, arguments checked (checkpoint_non_reentrant.cpp).
std::vector<at::Tensor> checkpoint_non_reentrant(const TensorListFunction& fn, const std::vector<at::Tensor>& inputs,
                                                 const CheckpointOptions& options);

}  // namespace remat::detail
