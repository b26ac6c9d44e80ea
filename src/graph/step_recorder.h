// Internal: recording a step (graph/recorded_step.h), and what the recorder and the runtime share.
#pragma once

#include <functional>
#include <memory>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include "graph/recorded_step.h"

namespace remat::detail {

/// Runs `forward` (returning the loss) recording its calls and saved tensors into `recorded`; the
/// backward the caller runs next completes the record (RecordedStep::complete).
at::Tensor record_step(const std::function<at::Tensor()>& forward, std::shared_ptr<RecordedStep>& recorded,
                       c10::Device device);

/// The allocator's current bytes on `device`.
int64_t bytes_now(c10::Device device);

/// The tensor at `slot` among `values` (a call's arguments or results); null if there is none.
/// `scratch` holds a list element.
const at::Tensor* slot_tensor(c10::ArrayRef<c10::IValue> values, const TensorSlot& slot, at::Tensor& scratch);

/// Throws the unplanned program's in-place error if `counter` moved past `version` since `entry` was saved.
void version_check(const c10::VariableVersion& counter, uint32_t version, const SavedEntry& entry, const char* where);

}  // namespace remat::detail
