// Internal: how remat's messages describe a tensor, the one form everywhere: "Float[3, 4] on cpu".
#pragma once

#include <sstream>
#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

namespace remat::detail {

/// "Float[3, 4]", or "Float[3, 4] on cuda:0" when `device` is given.
inline std::string tensor_text(c10::IntArrayRef sizes, c10::ScalarType dtype, const c10::Device* device = nullptr) {
  std::ostringstream os;
  os << dtype << sizes;
  if (device != nullptr) os << " on " << *device;
  return os.str();
}

}  // namespace remat::detail
