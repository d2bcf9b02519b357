#pragma once
// `--schedule auto`: every synchronous registered schedule planned for the same model, memory and
// stages, each with its best cuts and memory optimization; the fastest predicted step that fits
// is kept. PipeDream's async is left out: its stale weights train another model than the others.
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "profile/profile.h"

namespace dawnpiper {

struct ScheduleCandidate {
  std::string schedule;
  std::optional<Plan> plan;  // none: nothing fits the capacity under this schedule, or why_not
  std::string why_not;       // why a plan that fits cannot run, or why the schedule does not apply
};

// `options` planned once per candidate schedule (its own schedule ignored).
std::vector<ScheduleCandidate> plan_each_schedule(const Profile& profile, const PlanOptions& options);
// The fitting candidate with the fastest predicted step (ties: the smaller peak); null when none fits.
const Plan* fastest_fitting(const std::vector<ScheduleCandidate>& candidates);
// The table `plan --schedule auto` chose from: schedule, slowest stage, predicted step with its
// idle share, largest peak, which one was kept.
void print_schedule_table(std::ostream& out, const std::vector<ScheduleCandidate>& candidates);

// make_plan, and under --schedule auto the table it chose from written to `table` (when given).
Plan plan_and_compare_schedules(const Profile& profile, const PlanOptions& options, std::ostream* table);

}  // namespace dawnpiper
