#pragma once
// The optimizers DawnPiper trains with, as the planner and the runtime name them. LibTorch-free:
// the planner's memory model needs the state size, the trainer the kind.
#include <iosfwd>
#include <string>

namespace dawnpiper {

enum class OptimizerKind { Sgd, Adam, AdamW };

const char* optimizer_kind_name(OptimizerKind kind);              // "sgd" | "adam" | "adamw"
OptimizerKind optimizer_kind_from_name(const std::string& name);  // throws ConfigError
std::ostream& operator<<(std::ostream& out, OptimizerKind kind);  // by name

// Adam and AdamW keep two moments per parameter and need one parameter-sized temporary in their
// update; SGD one momentum buffer.
inline bool optimizer_has_moments(OptimizerKind kind) { return kind != OptimizerKind::Sgd; }
// Bytes of optimizer state per byte of parameters.
inline int optimizer_state_multiplier(OptimizerKind kind) { return optimizer_has_moments(kind) ? 2 : 1; }

}  // namespace dawnpiper
