#include "plan/calibrate.h"

#include <algorithm>
#include <stdexcept>

namespace dawnpiper {

namespace {
// What a stage's measured forward and backward take by the plan: its compute and the evictor's
// re-runs and copies inside them.
double predicted_ms(const StagePlan& s) { return s.compute_ms + s.memopt_ms; }
}  // namespace

double CalibrationRound::measured_bottleneck() const {
  return measured.empty() ? 0 : *std::max_element(measured.begin(), measured.end());
}

double CalibrationRound::measured_spread() const {
  if (measured.empty()) return 0;
  const double least = *std::min_element(measured.begin(), measured.end());
  return least > 0 ? measured_bottleneck() / least - 1 : 0;
}

void scale_stage_times(Profile& profile, const Plan& plan, const std::vector<double>& measured_ms) {
  if (measured_ms.size() != plan.stages.size()) throw std::logic_error("scale_stage_times: one time per stage");
  for (size_t x = 0; x < plan.stages.size(); ++x) {
    const StagePlan& s = plan.stages[x];
    const double predicted = predicted_ms(s);
    if (predicted <= 0 || measured_ms[x] <= 0) continue;
    const double f = measured_ms[x] / predicted;
    for (int n = s.begin; n < s.end; ++n) {
      NodeProfile& node = profile.nodes[static_cast<size_t>(n)];
      node.fwd_ms *= f, node.bwd_ms *= f, node.recompute_ms *= f;
      for (LinearFit* fit : {&node.fwd_ms_fit, &node.bwd_ms_fit}) fit->base *= f, fit->per_sample *= f;
    }
  }
}

CalibratedPlan calibrate_plan(const Profile& profile, const PlanOptions& options, int rounds,
                              const StageTimer& measure) {
  if (rounds < 1) throw std::logic_error("calibrate_plan: at least one round");
  CalibratedPlan out;
  out.profile = profile;
  for (int r = 0; r < rounds; ++r) {
    const Plan plan = make_plan(out.profile, options);
    CalibrationRound round;
    for (size_t x = 0; x < plan.stages.size(); ++x) {
      if (x > 0) round.cuts.push_back(plan.stages[x].begin);
      round.predicted.push_back(predicted_ms(plan.stages[x]));
    }
    round.measured = measure(plan);
    if (r == 0 || round.measured_bottleneck() < out.rounds[static_cast<size_t>(out.chosen)].measured_bottleneck())
      out.plan = plan, out.chosen = r;
    scale_stage_times(out.profile, plan, round.measured);
    out.rounds.push_back(std::move(round));
  }
  return out;
}

}  // namespace dawnpiper
