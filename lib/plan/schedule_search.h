#pragma once
// A PlanRequest resolved into a Plan: its one schedule planned (plan/planner.h), or under
// `--schedule auto` every candidate (ScheduleRequest::candidates: the synchronous registered
// schedules) planned for the same model, memory and ranks, each with its best cuts and memory
// optimization, and the fastest predicted step that fits kept. PipeDream's async is left out: its
// stale weights train another model than the others.
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "plan/planner.h"
#include "profile/profile.h"

namespace dawnpiper {

struct ScheduleCandidate {
  std::string schedule;
  std::optional<Plan> plan;  // none: nothing fits the capacity under this schedule, or why_not
  std::string why_not;       // why a plan that fits cannot run, or why the schedule does not apply
};

// `request` planned once per candidate schedule.
std::vector<ScheduleCandidate> plan_each_schedule(const Profile& profile, const PlanRequest& request);
// The fitting candidate with the fastest predicted step (ties: the smaller peak); null when none fits.
const Plan* fastest_fitting(const std::vector<ScheduleCandidate>& candidates);
// The table `plan --schedule auto` chose from: schedule, slowest stage, predicted step with its
// idle share, largest peak, which one was kept.
void print_schedule_table(std::ostream& out, const std::vector<ScheduleCandidate>& candidates);

// The plan `request` resolves to, and under --schedule auto the table it chose from written to
// `table` (when given). Throws what make_plan throws; under auto, where nothing fits, make_plan's
// message for 1f1b (the schedule that holds the fewest micro-batches).
Plan resolve_plan(const Profile& profile, const PlanRequest& request, std::ostream* table = nullptr);
// As resolve_plan, but nothing where nothing fits (no message, no table).
std::optional<Plan> try_resolve_plan(const Profile& profile, const PlanRequest& request);
// find_max_batch (plan/planner.h) of a request: each size resolved.
MaxBatch find_max_batch(const Profile& profile, const PlanRequest& request, int64_t upper_bound = 4096,
                        int threads = 0);

}  // namespace dawnpiper
