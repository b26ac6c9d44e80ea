// Internal: one item of a plan run as run_plan runs it (plan.cpp), for callers that time a plan
// item by item (the profiler's in-step pass).
#pragma once

#include <memory>

#include <ATen/core/Tensor.h>

#include "remat/chain/plan.h"

namespace remat::detail {

/// Runs `item`, which must lie inside `*plan` (a checkpointed segment's recompute reads it from
/// there during backward, after this returns), on `x`.
at::Tensor run_plan_item(Chain& chain, const std::shared_ptr<const Plan>& plan, const PlanItem& item, const at::Tensor& x);

}  // namespace remat::detail
