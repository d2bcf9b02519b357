#include "data/scalar_type.h"

#include <string>

#include "util/error.h"

namespace dawnpiper {

DType dtype_of(at::ScalarType type) {
  for (int i = 0; i <= static_cast<int>(DType::Bool); ++i)
    if (scalar_type(static_cast<DType>(i)) == type) return static_cast<DType>(i);
  throw ConfigError(std::string("tensors of type ") + c10::toString(type) + " are not supported");
}

}  // namespace dawnpiper
