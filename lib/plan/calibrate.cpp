#include "plan/calibrate.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "trace/trace.h"
#include "util/error.h"

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

namespace {
void scale_nodes(Profile& profile, int begin, int end, double f) {
  for (int n = begin; n < end; ++n) {
    NodeProfile& node = profile.nodes[static_cast<size_t>(n)];
    node.fwd_ms *= f, node.bwd_ms *= f, node.recompute_ms *= f;
    for (LinearFit* fit : {&node.fwd_ms_fit, &node.bwd_ms_fit}) fit->base *= f, fit->per_sample *= f;
  }
}
}  // namespace

void scale_stage_times(Profile& profile, const Plan& plan, const std::vector<double>& measured_ms) {
  if (measured_ms.size() != plan.stages.size()) throw std::logic_error("scale_stage_times: one time per stage");
  for (size_t x = 0; x < plan.stages.size(); ++x) {
    const StagePlan& s = plan.stages[x];
    const double predicted = predicted_ms(s);
    if (predicted > 0 && measured_ms[x] > 0) scale_nodes(profile, s.begin, s.end, measured_ms[x] / predicted);
  }
}

void scale_to_measured(Profile& profile, const std::vector<std::vector<MeasuredStage>>& runs) {
  std::vector<double> log_factor(static_cast<size_t>(profile.size()), 0);
  std::vector<int> measured(static_cast<size_t>(profile.size()), 0);
  for (const std::vector<MeasuredStage>& stages : runs)
    for (const MeasuredStage& s : stages) {
      if (s.begin < 0 || s.end > profile.size() || s.begin >= s.end)
        throw ConfigError("a traced stage has nodes [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
                          "), outside this profile's " + std::to_string(profile.size()) + " nodes");
      double profiled = 0;
      for (int n = s.begin; n < s.end; ++n)
        profiled += profile.nodes[static_cast<size_t>(n)].fwd_ms + profile.nodes[static_cast<size_t>(n)].bwd_ms;
      if (profiled <= 0 || s.compute_ms <= 0) continue;
      for (int n = s.begin; n < s.end; ++n)
        log_factor[static_cast<size_t>(n)] += std::log(s.compute_ms / profiled), ++measured[static_cast<size_t>(n)];
    }
  for (int n = 0; n < profile.size(); ++n)
    if (measured[static_cast<size_t>(n)] > 0)
      scale_nodes(profile, n, n + 1, std::exp(log_factor[static_cast<size_t>(n)] / measured[static_cast<size_t>(n)]));
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

void calibrate_from_traces(Profile& profile, const std::vector<std::string>& trace_paths) {
  std::vector<std::vector<MeasuredStage>> runs;
  for (const std::string& path : trace_paths) {
    const Trace t = read_trace(path);
    const std::string where = "--calibrate-trace " + path + ": ";
    if (t.preset != profile.preset) throw ConfigError(where + "a trace of " + t.preset + ", not of " + profile.preset);
    if (const std::string why = profile.device_mismatch(t.device); !why.empty()) throw ConfigError(where + why);
    // The fingerprint covers the operators, their names and parameter shapes, which the node
    // count does not (not activation shapes: those follow the micro-batch size; older files lack it).
    if (!t.graph_hash.empty() && !profile.graph_hash.empty() && t.graph_hash != profile.graph_hash)
      throw ConfigError(where + "a run of another graph than this profile's (fingerprint " + t.graph_hash + ", not " +
                        profile.graph_hash + "; give the model options the traced run had)");
    if (t.micro_batch_size != profile.micro_batch_size)
      throw ConfigError(where + "micro-batches of " + std::to_string(t.micro_batch_size) +
                        " samples, this plan's are " + std::to_string(profile.micro_batch_size));
    std::vector<StageCompute> measured;
    try {
      measured = measured_stage_compute(t, cpu_time_is_work(t));
    } catch (const ConfigError& e) {
      throw ConfigError(where + e.reason());
    }
    std::vector<MeasuredStage> stages;
    int64_t last_end = 0;
    for (const StageCompute& c : measured) {
      stages.push_back({static_cast<int>(c.node_begin), static_cast<int>(c.node_end), c.ms});
      last_end = std::max(last_end, c.node_end);
    }
    if (last_end != profile.size())
      throw ConfigError(where + "a graph of " + std::to_string(last_end) + " nodes, this profile's has " +
                        std::to_string(profile.size()) + " (give the model options the traced run had)");
    runs.push_back(std::move(stages));
  }
  scale_to_measured(profile, runs);
}

}  // namespace dawnpiper
