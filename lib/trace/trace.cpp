#include "trace/trace.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <cstdio>
#include <ostream>

#include "util/atomic_file.h"
#include "util/error.h"
#include "util/hdf5_io.h"
#include "util/hdf5_table.h"
#include "util/units.h"

namespace dawnpiper {

using namespace h5;

namespace {

// Each table's columns. "replica" and "cpu_s" were added within schema 2: older traces lack
// them (0).
const std::vector<Column<ActionRecord>>& action_columns() {
  using A = ActionRecord;
  static const std::vector<Column<A>> columns{
      member("stage", &A::stage),
      member("replica", &A::replica, true),
      member("micro_batch", &A::micro_batch),
      member("step", &A::step),
      member("bytes_sent", &A::bytes_sent),
      member("bytes_received", &A::bytes_received),
      member("live_bytes", &A::live_bytes),
      member("peak_bytes", &A::peak_bytes),
      member("tensor", &A::tensor),
      member("memopt_bytes", &A::memopt_bytes),
      member("start_s", &A::start_s),
      member("end_s", &A::end_s),
      member("cpu_s", &A::cpu_s, true),
      column_of<A>(
          "kind", [](const A& r) { return std::string(name_of(r.action_kind())); },
          [](A& r, const std::string& code) { r.kind = static_cast<int64_t>(from_name<ActionKind>(code)); })};
  return columns;
}

const std::vector<Column<StageRecord>>& stage_columns() {
  using S = StageRecord;
  static const std::vector<Column<S>> columns{
      member("stage", &S::stage),
      member("replica", &S::replica, true),
      member("rank", &S::rank),
      member("node_begin", &S::node_begin),
      member("node_end", &S::node_end),
      member("parameters", &S::parameters),
      member("predicted_peak_bytes", &S::predicted_peak_bytes),
      member("measured_peak_bytes", &S::measured_peak_bytes),
      member("predicted_ms_per_micro_batch", &S::predicted_ms_per_micro_batch),
      column_of<S>(
          "host", [](const S& r) { return std::string(r.host); },
          [](S& r, const std::string& host) { std::snprintf(r.host, sizeof r.host, "%s", host.c_str()); })};
  return columns;
}

}  // namespace

bool is_evictor(ActionKind kind) {
  return kind == ActionKind::SwapOut || kind == ActionKind::SwapIn || kind == ActionKind::Recompute;
}

bool is_busy_work(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward:
    case ActionKind::Backward:
    case ActionKind::BackwardInput:
    case ActionKind::BackwardWeight:
    case ActionKind::OptimizerStep:
    case ActionKind::Recompute:
    case ActionKind::SwapOut:
    case ActionKind::SwapIn:
      return true;
    default:
      return false;
  }
}

void write_trace(const Trace& t, const std::string& path) {
  write_atomically(path, [&](const std::string& tmp) {
    quiet_errors();
    Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose, "create " + path);
    write_attr(file, "format", "dawnpiper-trace");
    write_attr<int64_t>(file, "schema_version", Trace::kSchemaVersion);
    write_attr(file, "model", t.model);
    write_attr(file, "preset", t.preset);
    write_attr(file, "schedule", t.schedule);
    write_attr(file, "device", t.device);
    write_attr(file, "transport", t.transport);
    write_attr(file, "graph_hash", t.graph_hash);
    write_attr(file, "created", t.created.empty() ? now_iso8601() : t.created);
    write_attr<int64_t>(file, "stages", t.stages);
    write_attr<int64_t>(file, "virtual_stages", t.virtual_stages);
    write_attr<int64_t>(file, "replicas", t.replicas);
    write_attr<int64_t>(file, "micro_batch_size", t.micro_batch_size);
    write_attr<int64_t>(file, "micro_batches", t.micro_batches);
    write_attr<int64_t>(file, "first_step", t.first_step);
    write_attr<int64_t>(file, "steps", t.steps);
    write_attr<double>(file, "wall_s", t.wall_s);
    Handle actions(H5Gcreate2(file, "actions", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose, "create group");
    write_table(actions, t.actions, action_columns());
    Handle stages(H5Gcreate2(file, "stages", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose, "create group");
    write_table(stages, t.stage_records, stage_columns());
  });
}

Trace read_trace(const std::string& path) {
  quiet_errors();
  if (H5Fis_hdf5(path.c_str()) <= 0) throw ConfigError("'" + path + "' is not a readable HDF5 trace");
  try {
    Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, "open " + path);
    if (!has_attr(file, "format") || read_attr_string(file, "format") != "dawnpiper-trace")
      throw ConfigError("'" + path + "' is an HDF5 file but not a DawnPiper trace");
    const int64_t version = read_attr<int64_t>(file, "schema_version");
    if (version != Trace::kSchemaVersion)
      throw ConfigError("'" + path + "' has trace schema version " + std::to_string(version) + "; this build reads " +
                        std::to_string(Trace::kSchemaVersion));
    Trace t;
    t.model = read_attr_string(file, "model");
    t.preset = read_attr_string(file, "preset");
    t.schedule = read_attr_string(file, "schedule");
    t.device = read_attr_string(file, "device");
    t.transport = read_attr_string(file, "transport");
    t.created = read_attr_string(file, "created");
    t.stages = read_attr<int64_t>(file, "stages");
    if (has_attr(file, "graph_hash")) t.graph_hash = read_attr_string(file, "graph_hash");
    if (has_attr(file, "replicas")) t.replicas = read_attr<int64_t>(file, "replicas");
    if (has_attr(file, "virtual_stages")) t.virtual_stages = read_attr<int64_t>(file, "virtual_stages");
    t.micro_batch_size = read_attr<int64_t>(file, "micro_batch_size");
    t.micro_batches = read_attr<int64_t>(file, "micro_batches");
    t.first_step = read_attr<int64_t>(file, "first_step");
    t.steps = read_attr<int64_t>(file, "steps");
    t.wall_s = read_attr<double>(file, "wall_s");
    Handle actions(H5Gopen2(file, "actions", H5P_DEFAULT), H5Gclose, "open group actions");
    t.actions = read_table(actions, action_columns());
    Handle stages(H5Gopen2(file, "stages", H5P_DEFAULT), H5Gclose, "open group stages");
    t.stage_records = read_table(stages, stage_columns());
    return t;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError("'" + path + "' is not a complete DawnPiper trace (" + e.what() + ")");
  }
}

std::vector<StageSummary> summarize(const Trace& t) {
  std::vector<StageSummary> out(static_cast<size_t>(t.stages));
  for (int64_t s = 0; s < t.stages; ++s) out[s].stage = s;
  std::map<std::pair<int64_t, int64_t>, std::vector<std::pair<double, double>>> in_flight;  // (stage, replica)
  for (const ActionRecord& r : t.actions) {
    if (r.stage < 0 || r.stage >= t.stages) continue;
    StageSummary& s = out[r.stage];
    const double d = r.end_s - r.start_s;
    if (r.action_kind() == ActionKind::AllReduce && r.tensor >= 0) {  // a bucket in flight
      in_flight[{r.stage, r.replica}].emplace_back(r.start_s, r.end_s);
      continue;
    }
    if (r.action_kind() == ActionKind::AllReduce) {  // every replica's, averaged below
      s.allreduce_s += d / static_cast<double>(std::max<int64_t>(1, t.replicas));
      continue;
    }
    if (r.replica != 0) continue;  // the table shows replica 0's pipeline
    if (is_evictor(r.action_kind())) {
      s.memopt_s += d;
      if (r.action_kind() == ActionKind::SwapOut) s.swapped_bytes += r.memopt_bytes;
      if (r.action_kind() == ActionKind::Recompute) s.recomputed_bytes += r.memopt_bytes;
      continue;
    }
    (is_busy_work(r.action_kind()) ? s.busy_s : s.comm_s) += d;
    (is_busy_work(r.action_kind()) ? s.busy_cpu_s : s.comm_cpu_s) += r.cpu_s;
    s.peak_bytes = std::max(s.peak_bytes, r.peak_bytes);
    s.bytes_sent += r.bytes_sent;
    if (r.action_kind() == ActionKind::Forward) ++s.forwards, s.mean_forward_ms += 1e3 * d;
    // A split backward's I and W add up to the micro-batch's backward.
    if (is_backward(r.action_kind())) s.mean_backward_ms += 1e3 * d;
    if (passes_gradient_back(r.action_kind())) ++s.backwards;
    if (r.action_kind() == ActionKind::BackwardWeight) ++s.weights, s.mean_weight_ms += 1e3 * d;
  }
  for (auto& [key, spans] : in_flight) {  // their union
    std::sort(spans.begin(), spans.end());
    double total = 0, from = spans.front().first, to = spans.front().second;
    for (const auto& [a, b] : spans) {
      if (a > to) total += to - from, from = a, to = b;
      to = std::max(to, b);
    }
    total += to - from;
    out[static_cast<size_t>(key.first)].reduction_s += total / static_cast<double>(std::max<int64_t>(1, t.replicas));
  }
  for (StageSummary& s : out) {
    s.idle_fraction = t.wall_s > 0 ? 1 - s.busy_s / t.wall_s : 0;
    if (s.forwards) s.mean_forward_ms /= static_cast<double>(s.forwards);
    if (s.backwards) s.mean_backward_ms /= static_cast<double>(s.backwards);
    if (s.weights) s.mean_weight_ms /= static_cast<double>(s.weights);
  }
  return out;
}

bool cpu_time_is_work(const Trace& t) {
  if (t.device != "cpu") return false;
  double wall = 0, cpu = 0;
  for (const ActionRecord& r : t.actions) {
    if (r.action_kind() != ActionKind::Forward && !is_backward(r.action_kind())) continue;
    if (r.cpu_s <= 0) return false;  // a trace from before CPU times were recorded
    wall += r.end_s - r.start_s, cpu += r.cpu_s;
  }
  return wall > 0 && cpu <= 1.1 * wall;  // more would be several threads' time
}

std::vector<StageCompute> measured_stage_compute(const Trace& t, bool cpu) {
  std::vector<StageCompute> out(static_cast<size_t>(t.stages));
  for (const StageRecord& r : t.stage_records)
    if (r.replica == 0 && r.stage >= 0 && r.stage < t.stages)
      out[static_cast<size_t>(r.stage)] = {r.node_begin, r.node_end, 0};
  // The first step pays for first touches of memory; later ones are what a long run sees.
  const bool skip_first = std::any_of(t.actions.begin(), t.actions.end(), [&](const ActionRecord& r) {
    return r.step > t.first_step && passes_gradient_back(r.action_kind());
  });
  std::vector<std::vector<const ActionRecord*>> work(out.size()), evictions(out.size());
  for (const ActionRecord& r : t.actions) {
    if (r.replica != 0 || r.stage < 0 || r.stage >= t.stages || (skip_first && r.step == t.first_step)) continue;
    const ActionKind kind = r.action_kind();
    if (kind == ActionKind::Forward || is_backward(kind)) work[static_cast<size_t>(r.stage)].push_back(&r);
    if (is_evictor(kind)) evictions[static_cast<size_t>(r.stage)].push_back(&r);
  }
  auto by_start = [](const ActionRecord* a, const ActionRecord* b) { return a->start_s < b->start_s; };
  for (size_t x = 0; x < out.size(); ++x) {
    double ms = 0;
    int64_t micro_batches = 0;
    for (const ActionRecord* r : work[x]) {
      if (cpu && r->cpu_s <= 0)
        throw ConfigError("the trace has no CPU times (written before they were recorded); trace the run again");
      ms += 1e3 * (cpu ? r->cpu_s : r->end_s - r->start_s);
      micro_batches += passes_gradient_back(r->action_kind());
    }
    if (micro_batches == 0 || out[x].node_end <= out[x].node_begin)
      throw ConfigError("the trace has no backward of stage " + std::to_string(x) + " to measure");
    // The evictor's copies and re-runs inside a forward or backward come off it (those inside
    // another one, a swap-in a re-run waits for, once; those inside a send never counted), in
    // the enclosing action's CPU time per wall second where CPU time is the measure.
    std::sort(work[x].begin(), work[x].end(), by_start);
    std::sort(evictions[x].begin(), evictions[x].end(), by_start);
    double outer_end = -1;
    for (const ActionRecord* e : evictions[x]) {
      if (e->end_s <= outer_end) continue;
      auto after = std::upper_bound(work[x].begin(), work[x].end(), e, by_start);
      if (after == work[x].begin() || (*std::prev(after))->end_s < e->end_s) continue;
      const ActionRecord* in = *std::prev(after);
      const double wall = in->end_s - in->start_s;
      ms -= 1e3 * (e->end_s - e->start_s) * (cpu && wall > 0 ? in->cpu_s / wall : 1.0);
      outer_end = e->end_s;
    }
    out[x].ms = std::max(0.0, ms) / static_cast<double>(micro_batches);
  }
  return out;
}

double throughput(const Trace& t) {
  const double samples =
      static_cast<double>((t.steps - t.first_step) * t.micro_batches * t.micro_batch_size * t.replicas);
  return t.wall_s > 0 ? samples / t.wall_s : 0;
}

std::optional<TimedRun> schedule_bound(const Trace& t) {
  if (t.stages < 1 || t.virtual_stages < 1 || t.stages % t.virtual_stages != 0) return std::nullopt;
  const size_t ranks = static_cast<size_t>(t.stages / t.virtual_stages);
  Schedule recorded{t.schedule, static_cast<int>(t.stages), (t.steps - t.first_step) * t.micro_batches, {}};
  recorded.actions.resize(ranks);
  try {  // the recorded schedule's transport depth; a file's is 1
    recorded.sends_in_flight = ScheduleChoice::named(t.schedule).traits().sends_in_flight;
  } catch (const ConfigError&) {
  }
  std::vector<StageTimes> times(static_cast<size_t>(t.stages));
  std::vector<int64_t> updates(times.size(), 0);
  std::vector<std::vector<const ActionRecord*>> lists(ranks);  // per rank
  for (const ActionRecord& r : t.actions)
    if (r.replica == 0 && r.stage >= 0 && r.stage < t.stages && !is_evictor(r.action_kind()) &&
        r.action_kind() != ActionKind::AllReduce)
      lists[static_cast<size_t>(r.stage) % ranks].push_back(&r);
  for (size_t rank = 0; rank < ranks; ++rank) {
    std::stable_sort(lists[rank].begin(), lists[rank].end(),
                     [](const ActionRecord* a, const ActionRecord* b) { return a->start_s < b->start_s; });
    for (const ActionRecord* r : lists[rank]) {
      const size_t x = static_cast<size_t>(r->stage);
      recorded.actions[rank].push_back(Action{r->action_kind(), static_cast<int>(r->stage), r->micro_batch, -1});
      if (r->action_kind() == ActionKind::OptimizerStep)
        times[x].update_ms += 1e3 * (r->end_s - r->start_s), ++updates[x];
    }
  }
  for (size_t x = 0; x < times.size(); ++x)
    if (updates[x] > 0) times[x].update_ms /= static_cast<double>(updates[x]);
  for (const StageSummary& s : summarize(t)) {
    times[static_cast<size_t>(s.stage)].forward_ms = s.mean_forward_ms;
    times[static_cast<size_t>(s.stage)].backward_ms = s.mean_backward_ms;
    times[static_cast<size_t>(s.stage)].weight_ms = s.mean_weight_ms;
  }
  try {
    return simulate_times(recorded, times);
  } catch (const ScheduleError&) {
    return std::nullopt;  // records that are not whole lists (a run stopped mid-step)
  }
}

namespace {
// max / min - 1 of one per-stage figure (0 where a stage has none).
double spread(const std::vector<StageSummary>& stages, double StageSummary::*figure) {
  double most = 0, least = std::numeric_limits<double>::infinity();
  for (const StageSummary& s : stages) most = std::max(most, s.*figure), least = std::min(least, s.*figure);
  return least > 0 ? most / least - 1 : 0;
}

// The run, its throughput and the schedule's bound (the recorded lists at the measured pass
// times); returns the bound's mean efficiency (0 without one).
double print_run(const Trace& t, const std::optional<TimedRun>& bound, std::ostream& out) {
  char line[256];
  std::snprintf(
      line, sizeof line, "%s, %s schedule, %lld stages, %lld x %lld samples per step, steps %lld..%lld, %s, %s\n",
      t.preset.c_str(), t.schedule.c_str(), static_cast<long long>(t.stages), static_cast<long long>(t.micro_batches),
      static_cast<long long>(t.micro_batch_size), static_cast<long long>(t.first_step),
      static_cast<long long>(t.steps - 1), t.device.c_str(), t.transport.c_str());
  out << line;
  std::snprintf(line, sizeof line, "wall %.3f s, throughput %.1f samples/s\n", t.wall_s, throughput(t));
  out << line;
  if (!bound || bound->step_ms <= 0) return 0;
  double efficiency = 0;
  for (double idle : bound->idle_ms) efficiency += 1 - idle / bound->step_ms;
  efficiency /= static_cast<double>(bound->idle_ms.size());
  std::snprintf(line, sizeof line,
                "schedule bound: these lists with each stage's mean pass times and free messages take %.3f s "
                "(mean efficiency %.1f%%); the rest of the wall is communication and variance\n",
                bound->step_ms / 1e3, 100 * efficiency);
  out << line;
  return efficiency;
}

void print_stage_table(const Trace& t, const std::vector<StageSummary>& stages, std::ostream& out) {
  char line[256];
  out << "stage  busy s  comm s  idle  efficiency  F ms   B ms   peak memory  predicted    sent\n";
  for (const StageSummary& s : stages) {
    const StageRecord* rec = nullptr;
    for (const StageRecord& r : t.stage_records)
      if (r.stage == s.stage) rec = &r;
    const std::string predicted =
        rec && rec->predicted_peak_bytes > 0 ? format_bytes(static_cast<double>(rec->predicted_peak_bytes)) : "-";
    std::snprintf(line, sizeof line, "%5lld  %6.3f  %6.3f  %4.1f%%  %9.1f%%  %5.2f  %5.2f  %11s  %9s  %9s\n",
                  static_cast<long long>(s.stage), s.busy_s, s.comm_s, 100 * s.idle_fraction,
                  100 * (1 - s.idle_fraction), s.mean_forward_ms, s.mean_backward_ms,
                  format_bytes(static_cast<double>(s.peak_bytes)).c_str(), predicted.c_str(),
                  format_bytes(static_cast<double>(s.bytes_sent)).c_str());
    out << line;
  }
}

// How balanced the plan came out, measured (the paper reports 7.7%), and on a CPU whose ranks
// share cores, the CPU time beside the wall time.
void print_balance(const Trace& t, const std::vector<StageSummary>& stages, const std::optional<TimedRun>& bound,
                   double bound_efficiency, std::ostream& out) {
  char line[256];
  double mean_efficiency = 0;
  for (const StageSummary& s : stages) mean_efficiency += 1 - s.idle_fraction;
  mean_efficiency /= static_cast<double>(stages.size());
  std::snprintf(
      line, sizeof line, "busy time spread (max/min - 1) %.1f%%; mean efficiency %.1f%%%s\n",
      100 * spread(stages, &StageSummary::busy_s), 100 * mean_efficiency,
      !bound ? "" : (", bound " + std::to_string(static_cast<int>(std::lround(100 * bound_efficiency))) + "%").c_str());
  out << line;
  if (spread(stages, &StageSummary::busy_s) > 0.10)
    out << "the stages' busy times differ by more than 10%: `train --calibrate-trace` with this trace plans "
           "again from what this run measured\n";
  // On a CPU whose ranks share cores, busy wall time includes the others' turns on a core.
  const bool cpu_times =
      std::all_of(stages.begin(), stages.end(), [](const StageSummary& s) { return s.busy_cpu_s > 0; });
  if (t.device != "cpu" || !cpu_times) return;
  out << "busy CPU time per stage:";
  for (const StageSummary& s : stages) {
    std::snprintf(line, sizeof line, " %.3f s", s.busy_cpu_s);
    out << line;
  }
  std::snprintf(line, sizeof line, "; spread %.1f%%\n", 100 * spread(stages, &StageSummary::busy_cpu_s));
  out << line;
  // What waiting for messages cost the cores (a rank that spins takes its core-mate's time).
  double comm = 0, comm_cpu = 0;
  for (const StageSummary& s : stages) comm += s.comm_s, comm_cpu += s.comm_cpu_s;
  std::snprintf(line, sizeof line, "communication CPU time %.3f s of %.3f s spent sending and receiving (%.1f%%)\n",
                comm_cpu, comm, comm > 0 ? 100 * comm_cpu / comm : 0.0);
  out << line;
}

// Where each stage's time goes: every kind of action's time per step, largest first (replica 0;
// the evictor's records happen inside forwards and backwards and are left out). A wait shows up
// as the action that waited (a receive, or REDUCE_TIED waiting for the other stages).
void print_action_kinds(const Trace& t, const std::vector<StageSummary>& stages, std::ostream& out) {
  const double steps = static_cast<double>(std::max<int64_t>(1, t.steps - t.first_step));
  out << "time per step by action (replica 0):\n";
  for (const StageSummary& s : stages) {
    std::map<ActionKind, std::pair<int64_t, double>> kinds;  // count, seconds
    for (const ActionRecord& r : t.actions)
      if (r.stage == s.stage && r.replica == 0 && !is_evictor(r.action_kind()) &&
          !(r.action_kind() == ActionKind::AllReduce && r.tensor >= 0)) {  // (a bucket in flight: beside the rest)
        auto& [count, seconds] = kinds[r.action_kind()];
        ++count, seconds += r.end_s - r.start_s;
      }
    std::vector<std::pair<ActionKind, std::pair<int64_t, double>>> sorted(kinds.begin(), kinds.end());
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
    out << "  stage " << s.stage << ":";
    char item[96];
    for (const auto& [kind, figures] : sorted) {
      std::snprintf(item, sizeof item, " %s %.1f ms (%.3g x %.2f ms)", name_of(kind), 1e3 * figures.second / steps,
                    static_cast<double>(figures.first) / steps,
                    1e3 * figures.second / static_cast<double>(figures.first));
      out << item;
    }
    out << "\n";
  }
}

}  // namespace

void print_summary(const Trace& t, std::ostream& out) {
  const std::optional<TimedRun> bound = schedule_bound(t);
  const double bound_efficiency = print_run(t, bound, out);
  const std::vector<StageSummary> stages = summarize(t);
  print_stage_table(t, stages, out);
  if (stages.size() > 1) print_balance(t, stages, bound, bound_efficiency, out);
  if (t.replicas > 1) {
    char line[128];
    out << t.replicas
        << " data-parallel replicas (the table shows replica 0); gradient allreduce per stage, mean over replicas:";
    for (const StageSummary& s : stages) {
      std::snprintf(line, sizeof line, " %lld: %.3f s (%.1f%% of busy)", static_cast<long long>(s.stage), s.allreduce_s,
                    s.busy_s > 0 ? 100 * s.allreduce_s / s.busy_s : 0.0);
      out << line;
    }
    out << "\n";
    if (std::any_of(stages.begin(), stages.end(), [](const StageSummary& s) { return s.reduction_s > 0; })) {
      out << "gradient reductions in flight per stage (each bucket from its start until seen complete), mean over "
             "replicas, and the share the update did not wait for:";
      for (const StageSummary& s : stages) {
        std::snprintf(line, sizeof line, " %lld: %.3f s (%.1f%% hidden)", static_cast<long long>(s.stage),
                      s.reduction_s, s.reduction_s > 0 ? 100 * std::max(0.0, 1 - s.allreduce_s / s.reduction_s) : 0.0);
        out << line;
      }
      out << "\n";
    }
  }
  print_action_kinds(t, stages, out);
  for (const StageSummary& s : stages) {
    if (s.memopt_s == 0 && s.swapped_bytes == 0 && s.recomputed_bytes == 0) continue;
    char line[256];
    std::snprintf(
        line, sizeof line, "stage %lld memory optimization: %.3f s inside F/B, swapped out %s, recomputed %s\n",
        static_cast<long long>(s.stage), s.memopt_s, format_bytes(static_cast<double>(s.swapped_bytes)).c_str(),
        format_bytes(static_cast<double>(s.recomputed_bytes)).c_str());
    out << line;
  }
}

}  // namespace dawnpiper
