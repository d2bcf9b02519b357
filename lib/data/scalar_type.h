#pragma once
// The graph's dtypes as LibTorch scalar types and back (here, below exec/, because data sources
// make tensors of the graph's dtypes too).
#include <c10/core/ScalarType.h>

#include "util/dtype.h"

namespace dawnpiper {

inline at::ScalarType scalar_type(DType d) {
  switch (d) {
    case DType::F32:
      return at::kFloat;
    case DType::I64:
      return at::kLong;
    case DType::BF16:
      return at::kBFloat16;
    case DType::F16:
      return at::kHalf;
    case DType::F64:
      return at::kDouble;
    case DType::I32:
      return at::kInt;
    case DType::I16:
      return at::kShort;
    case DType::I8:
      return at::kChar;
    case DType::U8:
      return at::kByte;
    case DType::Bool:
      return at::kBool;
  }
  return at::kFloat;
}

// Throws ConfigError for scalar types the graph has no DType for (complex, quantized, ...).
DType dtype_of(at::ScalarType type);

}  // namespace dawnpiper
