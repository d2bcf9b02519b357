#pragma once
// Element types of graph tensors and safetensors files, by the names both use. LibTorch-free.
#include <string>

#include "util/enum_names.h"

namespace dawnpiper {

enum class DType { F32, I64, BF16, F16, F64, I32, I16, I8, U8, Bool };
int dtype_size(DType dtype);
const char* dtype_name(DType dtype);             // "float32", "int64", "bfloat16", ...
DType dtype_from_name(const std::string& name);  // throws ConfigError if unknown
bool is_floating(DType dtype);

// How a graph computes: fp32, or bf16 (bf16 compute with fp32 master weights and optimizer
// state). Graphs, profiles, plans and model files record it by name.
enum class Precision { Fp32, Bf16 };
template <>
struct EnumNames<Precision> {
  static constexpr const char* what = "precision";
  static constexpr std::array<std::pair<Precision, const char*>, 2> table{
      {{Precision::Fp32, "fp32"}, {Precision::Bf16, "bf16"}}};
};

}  // namespace dawnpiper
