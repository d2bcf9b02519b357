#include "train/optimizer_kind.h"

#include <ostream>

#include "util/error.h"

namespace dawnpiper {

const char* optimizer_kind_name(OptimizerKind kind) { return kind == OptimizerKind::Adam ? "adam" : "sgd"; }

OptimizerKind optimizer_kind_from_name(const std::string& name) {
  if (name == "sgd") return OptimizerKind::Sgd;
  if (name == "adam") return OptimizerKind::Adam;
  throw ConfigError("unknown optimizer '" + name + "' (choose sgd or adam)");
}

std::ostream& operator<<(std::ostream& out, OptimizerKind kind) { return out << optimizer_kind_name(kind); }

}  // namespace dawnpiper
