#include "plan/schedule_search.h"

#include <cstdio>
#include <ostream>

#include "plan/planner.h"
#include "schedule/registry.h"
#include "util/units.h"

namespace dawnpiper {

std::vector<ScheduleCandidate> plan_each_schedule(const Profile& profile, const PlanOptions& options) {
  std::vector<ScheduleCandidate> candidates;
  const int ranks = options.stages / options.schedule.virtual_stages();
  for (const ScheduleEntry& entry : registered_schedules()) {
    if (!entry.traits.updates_once_per_step) continue;
    PlanOptions one = options;
    one.schedule = ScheduleChoice::named(entry.name);  // an interleaved one with its default virtual stages
    one.stages = ranks * one.schedule.virtual_stages();
    if (entry.traits.interleaves() && (options.micro_batches % ranks != 0 || one.stages > profile.size())) {
      candidates.push_back({entry.name, std::nullopt,
                            options.micro_batches % ranks != 0 ? "micro-batches not a multiple of the ranks"
                                                               : "fewer nodes than stages"});
      continue;
    }
    ScheduleCandidate c{entry.name, try_plan(profile, one), ""};
    if (c.plan && entry.traits.splits_backward)
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

Plan plan_and_compare_schedules(const Profile& profile, const PlanOptions& options, std::ostream* table) {
  if (!options.schedule.is_auto()) return make_plan(profile, options);
  const std::vector<ScheduleCandidate> candidates = plan_each_schedule(profile, options);
  if (table) print_schedule_table(*table, candidates);
  const Plan* best = fastest_fitting(candidates);
  return best ? *best : make_plan(profile, options);  // make_plan says why nothing fits
}

}  // namespace dawnpiper
