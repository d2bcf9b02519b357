#include "train/optimizer_kind.h"

#include <ostream>

#include "util/error.h"

namespace dawnpiper {

const char* optimizer_kind_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::Sgd:
      return "sgd";
    case OptimizerKind::Adam:
      return "adam";
    case OptimizerKind::AdamW:
      return "adamw";
  }
  return "?";
}

OptimizerKind optimizer_kind_from_name(const std::string& name) {
  if (name == "sgd") return OptimizerKind::Sgd;
  if (name == "adam") return OptimizerKind::Adam;
  if (name == "adamw") return OptimizerKind::AdamW;
  throw ConfigError("unknown optimizer '" + name + "' (choose sgd, adam or adamw)");
}

std::ostream& operator<<(std::ostream& out, OptimizerKind kind) { return out << optimizer_kind_name(kind); }

}  // namespace dawnpiper
