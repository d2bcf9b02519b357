#include "plan/schedule_search.h"

#include <cstdio>
#include <ostream>

#include "plan/planner.h"
#include "util/units.h"

namespace dawnpiper {

std::vector<ScheduleCandidate> plan_each_schedule(const Profile& profile, const PlanRequest& request) {
  std::vector<ScheduleCandidate> candidates;
  for (const ScheduleChoice& schedule : request.schedule.candidates()) {
    const PlanOptions one = request.options_for(schedule);
    if (schedule.traits().interleaves() &&
        (request.micro_batches % request.ranks != 0 || one.stages > profile.size())) {
      candidates.push_back({schedule.name(), std::nullopt,
                            request.micro_batches % request.ranks != 0 ? "micro-batches not a multiple of the ranks"
                                                                       : "fewer nodes than stages"});
      continue;
    }
    ScheduleCandidate c{schedule.name(), try_plan(profile, one), ""};
    if (c.plan && schedule.traits().splits_backward)
      if (!split_backward_refusal(profile, *c.plan).empty()) c.why_not = "cannot split a stage's backward";
    if (!c.why_not.empty()) c.plan.reset();
    candidates.push_back(std::move(c));
  }
  return candidates;
}

const Plan* fastest_fitting(const std::vector<ScheduleCandidate>& candidates) {
  const Plan* best = nullptr;
  for (const ScheduleCandidate& c : candidates) {
    if (!c.plan) continue;
    const bool faster = best && c.plan->step_ms() < best->step_ms();
    const bool as_fast_smaller = best && c.plan->step_ms() == best->step_ms() &&
                                 c.plan->max_predicted_peak_bytes() < best->max_predicted_peak_bytes();
    if (!best || faster || as_fast_smaller) best = &*c.plan;
  }
  return best;
}

void print_schedule_table(std::ostream& out, const std::vector<ScheduleCandidate>& candidates) {
  const Plan* best = fastest_fitting(candidates);
  char line[200];
  std::snprintf(line, sizeof line, "%-11s %12s %14s %6s %11s\n", "schedule", "bottleneck", "predicted step", "idle",
                "max peak");
  out << "schedules compared (--schedule auto):\n" << line;
  for (const ScheduleCandidate& c : candidates) {
    if (!c.plan) {
      std::snprintf(line, sizeof line, "%-11s %12s %14s %6s %11s  %s\n", c.schedule.c_str(), "-", "-", "-", "-",
                    c.why_not.empty() ? "nothing fits" : c.why_not.c_str());
    } else {
      const Plan& p = *c.plan;
      std::snprintf(line, sizeof line, "%-11s %10.3fms %12.3fms %5.0f%% %11s%s\n", c.schedule.c_str(),
                    p.bottleneck_ms(), p.step_ms(), 100 * p.bubble_fraction(),
                    format_bytes(static_cast<double>(p.max_predicted_peak_bytes())).c_str(),
                    &p == best ? "  <- kept" : "");
    }
    out << line;
  }
}

namespace {
// The options whose message explains why a request fits nothing: its one schedule, or under auto
// 1f1b, the schedule that holds the fewest micro-batches.
PlanOptions explaining_options(const PlanRequest& request) {
  return request.options_for(request.schedule.is_auto() ? ScheduleChoice::named("1f1b") : request.schedule.choice());
}
}  // namespace

Plan resolve_plan(const Profile& profile, const PlanRequest& request, std::ostream* table) {
  if (!request.schedule.is_auto()) return make_plan(profile, request.options_for(request.schedule.choice()));
  const std::vector<ScheduleCandidate> candidates = plan_each_schedule(profile, request);
  if (table) print_schedule_table(*table, candidates);
  const Plan* best = fastest_fitting(candidates);
  return best ? *best : make_plan(profile, explaining_options(request));  // says why
}

std::optional<Plan> try_resolve_plan(const Profile& profile, const PlanRequest& request) {
  if (!request.schedule.is_auto()) return try_plan(profile, request.options_for(request.schedule.choice()));
  const std::vector<ScheduleCandidate> candidates = plan_each_schedule(profile, request);
  const Plan* best = fastest_fitting(candidates);
  return best ? std::optional<Plan>(*best) : std::nullopt;
}

MaxBatch find_max_batch(const Profile& profile, const PlanRequest& request, int64_t upper_bound, int threads) {
  return find_max_batch(
      profile, explaining_options(request), [&](const Profile& at) { return try_resolve_plan(at, request); },
      upper_bound, threads);
}

}  // namespace dawnpiper
