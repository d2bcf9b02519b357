#pragma once
// The registered schedules, one line each in registry.cpp; each generator lives in its own file
// of lib/schedule and writes compute actions only (add_communication adds the rest).
#include <cstdint>
#include <vector>

#include "schedule/schedule.h"

namespace dawnpiper {

using ComputeLists = std::vector<std::vector<Action>>;  // per rank: F, B, I, W and U actions in order

// What a generator lays out: `ranks` lists, virtual_stages stages on each (1 unless the schedule
// interleaves), micro_batches per step.
struct ScheduleShape {
  int ranks = 1;
  int virtual_stages = 1;
  int64_t micro_batches = 1;
};

struct ScheduleEntry {
  const char* name;
  const char* summary;  // one line: what --help and `plan --schedule auto` show
  ScheduleTraits traits;
  // Called with every size >= 1.
  ComputeLists (*generate)(const ScheduleShape& shape);
};
const std::vector<ScheduleEntry>& registered_schedules();

}  // namespace dawnpiper
