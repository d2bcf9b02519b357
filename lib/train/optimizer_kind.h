#pragma once
// The optimizers DawnPiper trains with, as the planner and the runtime name them. LibTorch-free:
// the planner's memory model needs the state size, the trainer the kind.
#include <iosfwd>
#include <string>
#include "util/enum_names.h"

namespace dawnpiper {

enum class OptimizerKind { Sgd, Adam, AdamW };
template <>
struct EnumNames<OptimizerKind> {
  static constexpr const char* what = "optimizer";
  static constexpr std::array<std::pair<OptimizerKind, const char*>, 3> table{
      {{OptimizerKind::Sgd, "sgd"}, {OptimizerKind::Adam, "adam"}, {OptimizerKind::AdamW, "adamw"}}};
};

// Adam and AdamW keep two moments per parameter and need one parameter-sized temporary in their
// update; SGD one momentum buffer.
inline bool optimizer_has_moments(OptimizerKind kind) { return kind != OptimizerKind::Sgd; }
// Bytes of optimizer state per byte of parameters.
inline int optimizer_state_multiplier(OptimizerKind kind) { return optimizer_has_moments(kind) ? 2 : 1; }

}  // namespace dawnpiper
