#include "trace/trace.h"

#include <algorithm>
#include <cstdio>
#include <ostream>

#include "util/atomic_file.h"
#include "util/error.h"
#include "util/hdf5_io.h"
#include "util/units.h"

namespace dawnpiper {

using namespace h5;

namespace {
template <typename Row, typename F>
auto column(const std::vector<Row>& rows, F get) {
  std::vector<decltype(get(rows[0]))> out;
  for (const Row& r : rows) out.push_back(get(r));
  return out;
}
}  // namespace

bool is_compute(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward:
    case ActionKind::Backward:
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
    write_attr(file, "created", t.created.empty() ? now_iso8601() : t.created);
    write_attr<int64_t>(file, "stages", t.stages);
    write_attr<int64_t>(file, "micro_batch_size", t.micro_batch_size);
    write_attr<int64_t>(file, "micro_batches", t.micro_batches);
    write_attr<int64_t>(file, "first_step", t.first_step);
    write_attr<int64_t>(file, "steps", t.steps);
    write_attr<double>(file, "wall_s", t.wall_s);
    const auto& a = t.actions;
    Handle actions(H5Gcreate2(file, "actions", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose, "create group");
    write_column(actions, "stage", column(a, [](const ActionRecord& r) { return r.stage; }));
    write_strings(actions, "kind", column(a, [](const ActionRecord& r) { return std::string(action_kind_code(r.action_kind())); }));
    write_column(actions, "micro_batch", column(a, [](const ActionRecord& r) { return r.micro_batch; }));
    write_column(actions, "step", column(a, [](const ActionRecord& r) { return r.step; }));
    write_column(actions, "start_s", column(a, [](const ActionRecord& r) { return r.start_s; }));
    write_column(actions, "end_s", column(a, [](const ActionRecord& r) { return r.end_s; }));
    write_column(actions, "bytes_sent", column(a, [](const ActionRecord& r) { return r.bytes_sent; }));
    write_column(actions, "bytes_received", column(a, [](const ActionRecord& r) { return r.bytes_received; }));
    write_column(actions, "live_bytes", column(a, [](const ActionRecord& r) { return r.live_bytes; }));
    write_column(actions, "peak_bytes", column(a, [](const ActionRecord& r) { return r.peak_bytes; }));
    const auto& s = t.stage_records;
    Handle stages(H5Gcreate2(file, "stages", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose, "create group");
    write_column(stages, "stage", column(s, [](const StageRecord& r) { return r.stage; }));
    write_column(stages, "rank", column(s, [](const StageRecord& r) { return r.rank; }));
    write_column(stages, "node_begin", column(s, [](const StageRecord& r) { return r.node_begin; }));
    write_column(stages, "node_end", column(s, [](const StageRecord& r) { return r.node_end; }));
    write_column(stages, "parameters", column(s, [](const StageRecord& r) { return r.parameters; }));
    write_column(stages, "predicted_peak_bytes", column(s, [](const StageRecord& r) { return r.predicted_peak_bytes; }));
    write_column(stages, "predicted_ms_per_micro_batch",
                 column(s, [](const StageRecord& r) { return r.predicted_ms_per_micro_batch; }));
    write_column(stages, "measured_peak_bytes", column(s, [](const StageRecord& r) { return r.measured_peak_bytes; }));
    write_strings(stages, "host", column(s, [](const StageRecord& r) { return std::string(r.host); }));
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
    t.micro_batch_size = read_attr<int64_t>(file, "micro_batch_size");
    t.micro_batches = read_attr<int64_t>(file, "micro_batches");
    t.first_step = read_attr<int64_t>(file, "first_step");
    t.steps = read_attr<int64_t>(file, "steps");
    t.wall_s = read_attr<double>(file, "wall_s");
    Handle actions(H5Gopen2(file, "actions", H5P_DEFAULT), H5Gclose, "open group actions");
    const auto stage = read_column<int64_t>(actions, "stage");
    const auto kind = read_strings(actions, "kind");
    const auto mb = read_column<int64_t>(actions, "micro_batch");
    const auto step = read_column<int64_t>(actions, "step");
    const auto start = read_column<double>(actions, "start_s");
    const auto end = read_column<double>(actions, "end_s");
    const auto sent = read_column<int64_t>(actions, "bytes_sent");
    const auto received = read_column<int64_t>(actions, "bytes_received");
    const auto live = read_column<int64_t>(actions, "live_bytes");
    const auto peak = read_column<int64_t>(actions, "peak_bytes");
    for (size_t i = 0; i < stage.size(); ++i) {
      ActionRecord r;
      r.stage = stage[i];
      r.kind = static_cast<int64_t>(action_kind_from_code(kind[i]));
      r.micro_batch = mb.at(i);
      r.step = step.at(i);
      r.start_s = start.at(i);
      r.end_s = end.at(i);
      r.bytes_sent = sent.at(i);
      r.bytes_received = received.at(i);
      r.live_bytes = live.at(i);
      r.peak_bytes = peak.at(i);
      t.actions.push_back(r);
    }
    Handle stages(H5Gopen2(file, "stages", H5P_DEFAULT), H5Gclose, "open group stages");
    const auto s_stage = read_column<int64_t>(stages, "stage");
    const auto s_rank = read_column<int64_t>(stages, "rank");
    const auto s_begin = read_column<int64_t>(stages, "node_begin");
    const auto s_end = read_column<int64_t>(stages, "node_end");
    const auto s_params = read_column<int64_t>(stages, "parameters");
    const auto s_pred = read_column<int64_t>(stages, "predicted_peak_bytes");
    const auto s_pred_ms = read_column<double>(stages, "predicted_ms_per_micro_batch");
    const auto s_meas = read_column<int64_t>(stages, "measured_peak_bytes");
    const auto s_host = read_strings(stages, "host");
    for (size_t i = 0; i < s_stage.size(); ++i) {
      StageRecord r;
      r.stage = s_stage[i];
      r.rank = s_rank.at(i);
      r.node_begin = s_begin.at(i);
      r.node_end = s_end.at(i);
      r.parameters = s_params.at(i);
      r.predicted_peak_bytes = s_pred.at(i);
      r.predicted_ms_per_micro_batch = s_pred_ms.at(i);
      r.measured_peak_bytes = s_meas.at(i);
      std::snprintf(r.host, sizeof r.host, "%s", s_host.at(i).c_str());
      t.stage_records.push_back(r);
    }
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
  for (const ActionRecord& r : t.actions) {
    if (r.stage < 0 || r.stage >= t.stages) continue;
    StageSummary& s = out[r.stage];
    const double d = r.end_s - r.start_s;
    (is_compute(r.action_kind()) ? s.busy_s : s.comm_s) += d;
    s.peak_bytes = std::max(s.peak_bytes, r.peak_bytes);
    s.bytes_sent += r.bytes_sent;
    if (r.action_kind() == ActionKind::Forward) ++s.forwards, s.mean_forward_ms += 1e3 * d;
    if (r.action_kind() == ActionKind::Backward) ++s.backwards, s.mean_backward_ms += 1e3 * d;
  }
  for (StageSummary& s : out) {
    s.idle_fraction = t.wall_s > 0 ? 1 - s.busy_s / t.wall_s : 0;
    if (s.forwards) s.mean_forward_ms /= static_cast<double>(s.forwards);
    if (s.backwards) s.mean_backward_ms /= static_cast<double>(s.backwards);
  }
  return out;
}

double throughput(const Trace& t) {
  const double samples = static_cast<double>((t.steps - t.first_step) * t.micro_batches * t.micro_batch_size);
  return t.wall_s > 0 ? samples / t.wall_s : 0;
}

double bubble_bound(const Trace& t) {
  return static_cast<double>(t.stages - 1) / static_cast<double>(t.micro_batches + t.stages - 1);
}

void print_summary(const Trace& t, std::ostream& out) {
  char line[256];
  std::snprintf(line, sizeof line, "%s, %s schedule, %lld stages, %lld x %lld samples per step, steps %lld..%lld, %s, %s\n",
                t.preset.c_str(), t.schedule.c_str(), static_cast<long long>(t.stages),
                static_cast<long long>(t.micro_batches), static_cast<long long>(t.micro_batch_size),
                static_cast<long long>(t.first_step), static_cast<long long>(t.steps - 1), t.device.c_str(),
                t.transport.c_str());
  out << line;
  std::snprintf(line, sizeof line, "wall %.3f s, throughput %.1f samples/s, bubble bound (l-1)/(m+l-1) = %.1f%%\n",
                t.wall_s, throughput(t), 100 * bubble_bound(t));
  out << line;
  out << "stage  busy s  comm s  idle  efficiency  F ms   B ms   peak memory  predicted    sent\n";
  for (const StageSummary& s : summarize(t)) {
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

}  // namespace dawnpiper
