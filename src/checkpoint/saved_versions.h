// Internal: the version of every tensor a checkpointed forward saved for its backward, kept so the
// recompute can refuse to read one that changed in place since (an optimizer step or a `copy_`
// before backward). LibTorch skips its own version check for tensors saved through hooks, and a
// tensor the function captures (a parameter, a constant) is recomputed from as it is now, not as
// the forward saw it: without this check such a change would give silently wrong gradients where
// the unchecked program raises "modified by an inplace operation".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/SmallVector.h>

namespace remat::detail {

class SavedVersions {
 public:
  /// Records `tensor`'s version counter (shared with its views and detached copies, not its data)
  /// and its current version.
  void record(const at::Tensor& tensor);
  /// Throws remat::Error naming the checkpoint, the tensor's shape and dtype if any recorded tensor
  /// changed in place since it was recorded.
  void check(const std::string& checkpoint_name) const;

 private:
  struct Entry {
    c10::VariableVersion counter;
    uint32_t version;
    at::ScalarType dtype;
    c10::SmallVector<int64_t, 4> sizes;
  };
  std::vector<Entry> entries_;
};

}  // namespace remat::detail
