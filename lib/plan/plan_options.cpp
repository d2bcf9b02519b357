#include "plan/plan_options.h"

#include <ostream>

#include "util/error.h"

namespace dawnpiper {

const char* planner_kind_name(PlannerKind kind) {
  switch (kind) {
    case PlannerKind::DawnPiper:
      return "dawnpiper";
    case PlannerKind::GPipe:
      return "gpipe";
    case PlannerKind::PipeDream:
      return "pipedream";
    case PlannerKind::VPipe:
      return "vpipe";
    case PlannerKind::Even:
      return "even";
    case PlannerKind::Exact:
      return "exact";
  }
  return "?";
}

const std::vector<PlannerKind>& all_planner_kinds() {
  static const std::vector<PlannerKind> kinds{PlannerKind::DawnPiper, PlannerKind::GPipe, PlannerKind::PipeDream,
                                              PlannerKind::VPipe,     PlannerKind::Even,  PlannerKind::Exact};
  return kinds;
}

PlannerKind planner_kind_from_name(const std::string& name) {
  for (PlannerKind kind : all_planner_kinds())
    if (name == planner_kind_name(kind)) return kind;
  throw ConfigError("unknown planner '" + name + "' (choose dawnpiper, gpipe, pipedream, vpipe, even or exact)");
}

std::ostream& operator<<(std::ostream& out, PlannerKind kind) { return out << planner_kind_name(kind); }

const char* memopt_mode_name(MemoptMode mode) {
  switch (mode) {
    case MemoptMode::None:
      return "none";
    case MemoptMode::Recompute:
      return "r";
    case MemoptMode::SwapRecompute:
      return "sr";
  }
  return "?";
}

MemoptMode memopt_mode_from_name(const std::string& name) {
  if (name == "none") return MemoptMode::None;
  if (name == "r") return MemoptMode::Recompute;
  if (name == "sr") return MemoptMode::SwapRecompute;
  throw ConfigError("unknown memopt '" + name + "' (choose none, r or sr)");
}

std::ostream& operator<<(std::ostream& out, MemoptMode mode) { return out << memopt_mode_name(mode); }

void set_device_memory(PlanOptions& options, int64_t device_memory, double headroom_share) {
  options.allocator_headroom_bytes =
      device_memory == kUnlimitedBytes ? 0 : static_cast<int64_t>(static_cast<double>(device_memory) * headroom_share);
  options.capacity_bytes = device_memory - options.allocator_headroom_bytes;
}

}  // namespace dawnpiper
