#pragma once
// The registered schedules, one line each in registry.cpp; each generator lives in its own file
// of lib/schedule and writes compute actions only (add_communication adds the rest).
#include <cstdint>
#include <vector>

#include "schedule/schedule.h"

namespace dawnpiper {

using ComputeLists = std::vector<std::vector<Action>>;  // per stage: F, B and U actions in order

struct ScheduleEntry {
  const char* name;
  const char* summary;  // one line: what --help and `plan --schedule auto` show
  ScheduleTraits traits;
  // Called with stages >= 1 and micro_batches >= 1.
  ComputeLists (*generate)(int stages, int64_t micro_batches);
};
const std::vector<ScheduleEntry>& registered_schedules();

}  // namespace dawnpiper
