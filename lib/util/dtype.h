#pragma once
// Element types of graph tensors and safetensors files, by the names both use. LibTorch-free.
#include <string>

namespace dawnpiper {

enum class DType { F32, I64, BF16, F16, F64, I32, I16, I8, U8, Bool };
int dtype_size(DType dtype);
const char* dtype_name(DType dtype);             // "float32", "int64", "bfloat16", ...
DType dtype_from_name(const std::string& name);  // throws ConfigError if unknown
bool is_floating(DType dtype);

}  // namespace dawnpiper
