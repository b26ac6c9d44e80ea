#include "checkpoint/saved_versions.h"

#include "base/tensor_text.h"

#include "remat/base/error.h"

namespace remat::detail {

void SavedVersions::record(const at::Tensor& tensor) {
  if (!tensor.defined()) return;
  const c10::VariableVersion& counter = tensor.unsafeGetTensorImpl()->version_counter();
  if (!counter.enabled()) return;                     // an inference tensor: it cannot change in place under autograd
  if (entries_.capacity() == 0) entries_.reserve(8);  // one allocation for a typical small function
  // A view shares its base's counter; the base is what the user knows (a weight, not weight.t()).
  const at::TensorBase& named = tensor.is_view() ? tensor._base() : static_cast<const at::TensorBase&>(tensor);
  entries_.push_back({counter, counter.current_version(), named.scalar_type(),
                      c10::SmallVector<int64_t, 4>(named.sizes().begin(), named.sizes().end())});
}

void SavedVersions::check(const std::string& checkpoint_name) const {
  for (const Entry& entry : entries_) {
    const uint32_t now = entry.counter.current_version();
    REMAT_CHECK(now == entry.version, "checkpoint '", checkpoint_name, "': a ",
                tensor_text(c10::IntArrayRef(entry.sizes), entry.dtype),
                " tensor that the function saved for backward (an input, a parameter, ",
                "a captured tensor or a result) was modified in place after the forward (its version is ", now,
                ", the forward saw ", entry.version,
                "), so the recompute would read the new values and give wrong gradients. Change it only after "
                "backward (an optimizer step belongs after backward), or clone it before changing it in place.");
  }
}

}  // namespace remat::detail
