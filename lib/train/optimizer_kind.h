#pragma once
// The optimizers DawnPiper trains with, as the planner and the runtime name them. LibTorch-free:
// the planner's memory model needs the state size, the trainer the kind.
#include <iosfwd>
#include <string>

namespace dawnpiper {

enum class OptimizerKind { Sgd, Adam };

const char* optimizer_kind_name(OptimizerKind kind);              // "sgd" | "adam"
OptimizerKind optimizer_kind_from_name(const std::string& name);  // throws ConfigError
std::ostream& operator<<(std::ostream& out, OptimizerKind kind);  // by name

// Bytes of optimizer state per byte of parameters: SGD's momentum buffer, Adam's two moments.
inline int optimizer_state_multiplier(OptimizerKind kind) { return kind == OptimizerKind::Adam ? 2 : 1; }

}  // namespace dawnpiper
