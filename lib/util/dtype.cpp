#include "util/dtype.h"

#include "util/error.h"

namespace dawnpiper {

namespace {
struct DTypeInfo {
  const char* name;
  int size;
  bool floating;
};
const DTypeInfo kDTypes[] = {
    {"float32", 4, true}, {"int64", 8, false}, {"bfloat16", 2, true}, {"float16", 2, true}, {"float64", 8, true},
    {"int32", 4, false},  {"int16", 2, false}, {"int8", 1, false},    {"uint8", 1, false},  {"bool", 1, false},
};
static_assert(sizeof(kDTypes) / sizeof(kDTypes[0]) == static_cast<int>(DType::Bool) + 1, "dtype table out of sync");
}  // namespace

int dtype_size(DType dtype) { return kDTypes[static_cast<int>(dtype)].size; }
const char* dtype_name(DType dtype) { return kDTypes[static_cast<int>(dtype)].name; }
bool is_floating(DType dtype) { return kDTypes[static_cast<int>(dtype)].floating; }

DType dtype_from_name(const std::string& name) {
  for (int i = 0; i <= static_cast<int>(DType::Bool); ++i)
    if (name == kDTypes[i].name) return static_cast<DType>(i);
  throw ConfigError("unsupported dtype '" + name + "'");
}

}  // namespace dawnpiper
