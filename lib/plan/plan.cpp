#include "plan/plan.h"

#include <algorithm>
#include <cstdio>
#include <ostream>

#include "util/error.h"
#include "util/json.h"
#include "util/units.h"

namespace dawnpiper {

double Plan::bottleneck_ms() const {
  double worst = 0;
  for (const StagePlan& s : stages) worst = std::max(worst, s.time_ms());
  return worst;
}

void Plan::time_step() {
  timed_step_ms = timed_idle_share = 0;
  if (!options.schedule.traits().drains_every_step) {  // the steady state of a full pipeline
    timed_step_ms = static_cast<double>(options.micro_batches) * bottleneck_ms();
    return;
  }
  std::vector<StageTimes> times;
  double allreduce = 0;  // (plans without the collectives' placement)
  for (const StagePlan& s : stages) {
    StageTimes t;
    t.forward_ms = s.forward_ms;
    t.backward_ms = s.compute_ms - s.forward_ms + s.memopt_ms;  // recomputation and swap stalls wait in backward
    t.weight_ms = s.weight_ms;
    t.send_ms = static_cast<double>(s.crossing_bytes) / options.link_bandwidth * 1e3;
    t.reduce_ms = s.reduce_ms, t.reduce_tail_ms = s.reduce_tail_ms, t.at_update_ms = s.at_update_ms;
    t.gather_ms = s.gather_ms, t.pass_ms = s.pass_ms;
    t.update_ms = s.update_ms;
    t.drag = options.replica_drag;
    times.push_back(t);
    if (s.reduce_ms + s.at_update_ms + s.pass_ms == 0) allreduce = std::max(allreduce, s.allreduce_ms);
  }
  const TimedRun run =
      simulate_times(options.schedule.make(static_cast<int>(stages.size()), options.micro_batches), times);
  double idle = 0;
  for (double ms : run.idle_ms) idle += ms;
  timed_step_ms = run.step_ms + allreduce;
  timed_idle_share = run.step_ms > 0 ? idle / (run.step_ms * static_cast<double>(run.idle_ms.size())) : 0;
}

std::vector<int64_t> Plan::rank_peak_bytes(bool predicted) const {
  if (predicted && !rank_replayed_peaks.empty()) return rank_replayed_peaks;
  const int ranks = static_cast<int>(stages.size()) / options.schedule.virtual_stages();
  std::vector<int64_t> peaks(static_cast<size_t>(ranks), 0);
  for (const StagePlan& s : stages)
    peaks[static_cast<size_t>(s.index % ranks)] += predicted ? s.memory.predicted_peak() : s.memory.total();
  return peaks;
}

int64_t Plan::max_peak_bytes() const {
  const std::vector<int64_t> peaks = rank_peak_bytes(false);
  return peaks.empty() ? 0 : *std::max_element(peaks.begin(), peaks.end());
}

int64_t Plan::max_predicted_peak_bytes() const {
  const std::vector<int64_t> peaks = rank_peak_bytes(true);
  return peaks.empty() ? 0 : *std::max_element(peaks.begin(), peaks.end());
}

namespace {

Json int_list(const std::vector<int>& values) {
  Json list = Json::array();
  for (int v : values) list.push_back(v);
  return list;
}

std::vector<int> int_list_from(const Json& list) {
  std::vector<int> values;
  for (const Json& v : list) values.push_back(static_cast<int>(v.get<int64_t>()));
  return values;
}

Json eviction_json(const Eviction& ev) {
  Json t = Json::object();
  t["tensor"] = ev.tensor;
  t["action"] = name_of(ev.action);
  t["evict_after"] = ev.evict_after;
  t["restore_before"] = ev.restore_before;
  t["prefetch_at"] = ev.prefetch_at;
  if (ev.action == TensorAction::Recompute) {
    t["rerun"] = int_list(ev.rerun);
    t["leaves"] = int_list(ev.leaves);
  }
  if (ev.internal.node >= 0) t["internal"] = Json{{"node", ev.internal.node}, {"copy_of", ev.internal.copy_of}};
  return t;
}

Eviction eviction_from_json(const Json& t) {
  Eviction ev;
  ev.tensor = t.at("tensor").get<int>();
  ev.action = from_name<TensorAction>(t.at("action").get<std::string>());
  if (ev.action == TensorAction::Keep)
    throw ConfigError("plan eviction of tensor " + std::to_string(ev.tensor) + " keeps it");
  ev.evict_after = t.at("evict_after").get<int>();
  ev.restore_before = t.at("restore_before").get<int>();
  ev.prefetch_at = t.at("prefetch_at").get<int>();
  if (ev.action == TensorAction::Recompute) {
    ev.rerun = int_list_from(t.at("rerun"));
    ev.leaves = int_list_from(t.at("leaves"));
  }
  if (t.contains("internal")) {
    ev.internal.node = t.at("internal").at("node").get<int>();
    ev.internal.copy_of = t.at("internal").at("copy_of").get<int>();
  }
  return ev;
}

template <class M, class Field>
void memory_fields(M& m, Field&& field) {
  field("weights", m.weights);
  field("weight_versions", m.weight_versions);
  field("stashed_weights", m.stashed_weights);
  field("gradients", m.gradients);
  field("optimizer", m.optimizer);
  field("activation_per_micro_batch", m.activation_per_micro_batch);
  field("in_flight", m.in_flight);
  field("activations", m.activations);
  field("transient", m.transient);
  field("constants", m.constants, kOptionalField);
  field("runtime", m.runtime, kOptionalField);
  field("replayed_peak", m.replayed_peak, kOptionalField);
}

Json memory_json(const MemoryBreakdown& m) {
  Json j = Json::object();
  memory_fields(m, JsonWriter{j});
  j["peak"] = m.total();
  return j;
}

MemoryBreakdown memory_from_json(const Json& j) {
  MemoryBreakdown m;
  memory_fields(m, JsonReader{j});
  if (j.contains("peak") && j.at("peak").get<int64_t>() != m.total())
    throw ConfigError("plan: a stage's memory peak does not match its breakdown");
  return m;
}

// A stage's numbers (its lists and memory are written beside them).
template <class S, class Field>
void stage_fields(S& s, Field&& field) {
  field("index", s.index);
  field("begin", s.begin);
  field("end", s.end);
  field("compute_ms", s.compute_ms);
  field("forward_ms", s.forward_ms, kOptionalField);
  field("weight_ms", s.weight_ms, kOptionalField);
  field("memopt_ms", s.memopt_ms);
  field("allreduce_ms", s.allreduce_ms, kOptionalField);
  field("allreduce_per_micro_batch_ms", s.allreduce_per_micro_batch_ms, kOptionalField);
  field("reduce_ms", s.reduce_ms, kOptionalField);
  field("reduce_tail_ms", s.reduce_tail_ms, kOptionalField);
  field("at_update_ms", s.at_update_ms, kOptionalField);
  field("gather_ms", s.gather_ms, kOptionalField);
  field("pass_ms", s.pass_ms, kOptionalField);
  field("update_ms", s.update_ms, kOptionalField);
  field("update_per_micro_batch_ms", s.update_per_micro_batch_ms, kOptionalField);
}

template <class S, class Field>
void stage_peak_fields(S& s, Field&& field) {
  field("peak_without_memopt", s.peak_without_memopt);
  field("replayed_peak_without_memopt", s.replayed_peak_without_memopt, kOptionalField);
}

template <class D, class Field>
void decision_fields(D& d, Field&& field) {
  field("tensor", d.tensor);
  field("bytes", d.bytes);
  field("action", d.action);
  field("restore_before", d.restore_before, kOptionalField);
  field("prefetch_at", d.prefetch_at, kOptionalField);
}

// What the plan was made for and with (the file's "inputs").
template <class P, class Field>
void input_fields(P& p, Field&& field) {
  field("stages", p.options.stages);
  field("micro_batches", p.options.micro_batches);
  field("micro_batch_size", p.micro_batch_size);
  field("optimizer", p.options.optimizer);
  field("capacity_bytes", p.options.capacity_bytes);
  field("allocator_headroom_bytes", p.options.allocator_headroom_bytes, kOptionalField);
  field("host_bandwidth", p.options.host_bandwidth);
  field("link_bandwidth", p.options.link_bandwidth);
  field("replica_bandwidth", p.options.replica_bandwidth, kOptionalField);
  field("replica_drag", p.options.replica_drag, kOptionalField);
  field("memopt", p.options.memopt);
  field("data_parallel", p.options.data_parallel, kOptionalField);
  field("zero_stage", p.options.zero_stage, kOptionalField);
  field("bucket_bytes", p.options.bucket_bytes, kOptionalField);
  field("nodes", p.nodes);
}

// A schedule file's actions travel in the plan: `train` runs what `plan` read.
void schedule_to_json(const ScheduleChoice& schedule, Json& in) {
  in["schedule"] = schedule.name();
  if (schedule.is_file()) in["schedule_actions"] = schedule.actions_text();
  if (schedule.virtual_stages() > 1) in["virtual_stages"] = schedule.virtual_stages();
}

ScheduleChoice schedule_from_json(const Json& in) {
  const std::string name = in.at("schedule").get<std::string>();
  const int virtual_stages = in.contains("virtual_stages") ? in.at("virtual_stages").get<int>() : 1;
  if (!in.contains("schedule_actions")) return ScheduleChoice::named(name).with_virtual_stages(virtual_stages);
  return ScheduleChoice::from_actions(name, in.at("schedule_actions").get<std::string>());
}

template <class P, class Field>
void header_fields(P& p, Field&& field) {
  field("planner", p.options.planner);
  field("model", p.model);
  field("preset", p.preset);
  field("precision", p.precision);
  field("graph_hash", p.graph_hash);
}

}  // namespace

std::string Plan::to_json(int indent) const {
  Json j = Json::object();
  j["format"] = "dawnpiper-plan";
  j["version"] = version;
  header_fields(*this, JsonWriter{j});
  Json in = Json::object();
  input_fields(*this, JsonWriter{in});
  schedule_to_json(options.schedule, in);
  if (options.host_link.measured()) in["host_link"] = Json::parse(options.host_link.to_json());
  j["inputs"] = in;
  j["planning_ms"] = planning_ms;
  j["bottleneck_ms"] = bottleneck_ms();
  j["max_peak_bytes"] = max_peak_bytes();
  j["max_predicted_peak_bytes"] = max_predicted_peak_bytes();
  if (!rank_replayed_peaks.empty()) j["rank_replayed_peaks"] = rank_replayed_peaks;
  Json list = Json::array();
  for (const StagePlan& s : stages) {
    Json st = Json::object();
    stage_fields(s, JsonWriter{st});
    st["time_ms"] = s.time_ms();
    st["memory"] = memory_json(s.memory);
    stage_peak_fields(s, JsonWriter{st});
    Json crossing = Json::array();
    for (const TensorBytes& c : s.crossing) {
      Json t = Json::object();
      t["tensor"] = c.tensor;
      t["bytes"] = c.bytes;
      crossing.push_back(t);
    }
    st["crossing"] = crossing;
    st["crossing_bytes"] = s.crossing_bytes;
    Json decisions = Json::array();
    for (const TensorDecision& d : s.decisions) {
      Json t = Json::object();
      decision_fields(d, JsonWriter{t});
      decisions.push_back(t);
    }
    st["decisions"] = decisions;
    Json evictions = Json::array();
    for (const Eviction& ev : s.evictions) evictions.push_back(eviction_json(ev));
    st["evictions"] = evictions;
    list.push_back(st);
  }
  j["stages"] = list;
  return j.dump(indent);
}

namespace {

StagePlan stage_from_json(const Json& st) {
  StagePlan s;
  stage_fields(s, JsonReader{st});
  s.memory = memory_from_json(st.at("memory"));
  stage_peak_fields(s, JsonReader{st});
  for (const Json& c : st.at("crossing"))
    s.crossing.push_back({c.at("tensor").get<int>(), c.at("bytes").get<int64_t>()});
  s.crossing_bytes = st.at("crossing_bytes").get<int64_t>();
  for (const Json& d : st.at("decisions")) {
    TensorDecision decision;
    decision_fields(decision, JsonReader{d});
    s.decisions.push_back(decision);
  }
  for (const Json& ev : st.at("evictions")) s.evictions.push_back(eviction_from_json(ev));
  return s;
}

Plan plan_fields(const Json& j) {
  if (!j.is_object() || !j.contains("format") || j.at("format").get<std::string>() != "dawnpiper-plan")
    throw ConfigError("not a DawnPiper plan (missing \"format\": \"dawnpiper-plan\")");
  Plan p;
  p.version = j.at("version").get<int>();
  if (p.version != Plan::kVersion)
    throw ConfigError("plan version " + std::to_string(p.version) + " is not supported (this build reads version " +
                      std::to_string(Plan::kVersion) +
                      (p.version < Plan::kVersion ? "; plans before it lack their stage programs: make it again with "
                                                    "`dawnpiper plan`)"
                                                  : ")"));
  header_fields(p, JsonReader{j});
  input_fields(p, JsonReader{j.at("inputs")});
  p.options.schedule = schedule_from_json(j.at("inputs"));
  if (j.at("inputs").contains("host_link"))
    p.options.host_link = HostLink::from_json(j.at("inputs").at("host_link").dump());
  p.planning_ms = j.at("planning_ms").get<double>();
  for (const Json& st : j.at("stages")) p.stages.push_back(stage_from_json(st));
  if (j.contains("rank_replayed_peaks"))
    p.rank_replayed_peaks = j.at("rank_replayed_peaks").get<std::vector<int64_t>>();
  // The runtime relies on these: contiguous stages covering every node, in order.
  if (static_cast<int>(p.stages.size()) != p.options.stages)
    throw ConfigError("plan lists " + std::to_string(p.stages.size()) + " stages but says " +
                      std::to_string(p.options.stages));
  if (p.options.stages % p.options.schedule.virtual_stages() != 0)
    throw ConfigError("plan has " + std::to_string(p.options.stages) + " stages, which " +
                      std::to_string(p.options.schedule.virtual_stages()) + " virtual stages per rank do not divide");
  int expected_begin = 0;
  for (size_t x = 0; x < p.stages.size(); ++x) {
    const StagePlan& s = p.stages[x];
    if (s.index != static_cast<int>(x) || s.begin != expected_begin || s.end <= s.begin)
      throw ConfigError("plan stage " + std::to_string(x) + " has a bad node range [" + std::to_string(s.begin) + ", " +
                        std::to_string(s.end) + ")");
    expected_begin = s.end;
  }
  if (expected_begin != p.nodes)
    throw ConfigError("plan stages cover " + std::to_string(expected_begin) + " of " + std::to_string(p.nodes) +
                      " nodes");
  p.time_step();
  return p;
}

// Under ZeRO, what a replica holds of each stage's optimizer state (the grad+opt column holds it),
// gradients and parameters.
void print_sharding(const Plan& plan, std::ostream& out) {
  const PlanOptions& options = plan.options;
  // The stage's parameters (level 3's memory.weights is what a replica holds of them; its
  // gradient shard is 1/D of them, rounded up).
  auto whole = [&](const StagePlan& s) {
    return options.sharding() >= 3 ? s.memory.gradients * options.data_parallel : s.memory.weights;
  };
  auto per_stage = [&](const char* what, auto held, auto of) {
    out << what;
    for (const StagePlan& s : plan.stages)
      out << (s.index ? ", " : " ") << s.index << ": " << format_bytes(static_cast<double>(held(s))) << " of "
          << format_bytes(static_cast<double>(of(s)));
  };
  out << "zero-stage " << options.sharding() << " over " << options.data_parallel << " replicas (buckets of "
      << format_bytes(static_cast<double>(options.bucket_bytes)) << "): ";
  per_stage(
      "optimizer state per replica", [](const StagePlan& s) { return s.memory.optimizer; },
      [&](const StagePlan& s) { return optimizer_state_multiplier(options.optimizer) * whole(s); });
  if (options.sharding() >= 2)  // and of the gradients (the buckets in flight come on top)
    per_stage(
        "; gradient shard per replica", [](const StagePlan& s) { return s.memory.gradients; }, whole);
  if (options.sharding() >= 3)  // and of the parameters: the shard and about a bucket gathered
    per_stage(
        "; parameters held per replica", [](const StagePlan& s) { return s.memory.weights; }, whole);
  out << "\n";
}

// Stages that bring every swapped tensor back only when its backward needs it (the planner's
// last resort, where nothing else fits) wait for those copies: which, "" where none.
std::string late_swapping_stages(const Plan& plan) {
  std::string late;
  for (const StagePlan& s : plan.stages) {
    bool swaps = false, all_late = true;
    for (const TensorDecision& d : s.decisions) {
      if (d.action == TensorAction::Keep) continue;
      swaps = swaps || d.action == TensorAction::Swap;
      all_late = all_late && d.action == TensorAction::Swap && d.prefetch_at == d.restore_before;
    }
    if (swaps && all_late) late += (late.empty() ? "" : ", ") + std::to_string(s.index);
  }
  return late;
}

}  // namespace

Plan plan_from_json(const std::string& text) {
  return read_json("malformed plan", [&] { return plan_fields(Json::parse(text)); });
}

void Plan::print_table(std::ostream& out) const {
  char line[512];
  std::string capacity = options.capacity_bytes == kUnlimitedBytes
                             ? std::string("unlimited")
                             : format_bytes(static_cast<double>(options.capacity_bytes));
  if (options.allocator_headroom_bytes > 0)
    capacity +=
        " (+ " + format_bytes(static_cast<double>(options.allocator_headroom_bytes)) + " left to the allocator)";
  const int v = options.schedule.virtual_stages();
  out << "plan: planner " << name_of(options.planner) << ", " << options.stages << " stages"
      << (v > 1 ? " (" + std::to_string(options.stages / v) + " ranks x " + std::to_string(v) + ")" : "")
      << ", schedule " << name_of(options.schedule) << ", " << options.micro_batches << " micro-batches of "
      << micro_batch_size << ", optimizer " << name_of(options.optimizer) << ", memopt " << name_of(options.memopt)
      << ", capacity " << capacity << "\n";
  if (options.memopt != MemoptKind::None)
    out << "host link for swaps: "
        << (options.host_link.measured()
                ? "measured, " + options.host_link.summary()
                : format_bytes(options.host_bandwidth) + "/s (" +
                      (options.host_bandwidth_given ? "--host-bandwidth" : "not measured: the default") + ")")
        << "\n";
  std::snprintf(line, sizeof line, "%5s %13s %10s %10s %10s %11s %11s %11s %11s %4s %4s %11s %7s\n", "stage", "nodes",
                "compute", "memopt", "time", "peak", "weights*v", "grad+opt", "act/mb", "in", "ver", "sent/mb",
                "sw/rc");
  out << line;
  for (const StagePlan& s : stages) {
    int swaps = 0, recomputes = 0;
    for (const TensorDecision& d : s.decisions) {
      swaps += d.action == TensorAction::Swap;
      recomputes += d.action == TensorAction::Recompute;
    }
    char range[32], sw[24];
    std::snprintf(range, sizeof range, "[%d,%d)", s.begin, s.end);
    std::snprintf(sw, sizeof sw, "%d/%d", swaps, recomputes);
    const MemoryBreakdown& m = s.memory;
    std::snprintf(line, sizeof line, "%5d %13s %8.2fms %8.2fms %8.2fms %11s %11s %11s %11s %4d %4d %11s %7s\n", s.index,
                  range, s.compute_ms, s.memopt_ms, s.time_ms(),
                  format_bytes(static_cast<double>(m.predicted_peak())).c_str(),
                  format_bytes(static_cast<double>(m.weights + m.stashed_weights)).c_str(),
                  format_bytes(static_cast<double>(m.gradients + m.optimizer)).c_str(),
                  format_bytes(static_cast<double>(m.activation_per_micro_batch)).c_str(), m.in_flight,
                  m.weight_versions, format_bytes(static_cast<double>(s.crossing_bytes)).c_str(), sw);
    out << line;
  }
  if (std::any_of(stages.begin(), stages.end(), [](const StagePlan& s) { return s.update_ms > 0; })) {
    out << "optimizer update per " << (options.schedule.traits().updates_once_per_step ? "step" : "micro-batch")
        << " (in the time column per micro-batch):";
    for (const StagePlan& s : stages) {
      std::snprintf(line, sizeof line, "%s %d: %.2f ms", s.index ? "," : "", s.index, s.update_ms);
      out << line;
    }
    out << "\n";
  }
  std::snprintf(line, sizeof line,
                "bottleneck %.3f ms per micro-batch, predicted step %.3f ms (%.0f%% idle), max peak %s, planned in "
                "%.2f ms\n",
                bottleneck_ms(), step_ms(), 100 * bubble_fraction(),
                format_bytes(static_cast<double>(max_predicted_peak_bytes())).c_str(), planning_ms);
  out << line;
  if (options.sharding() > 0) print_sharding(*this, out);
  if (v > 1) {  // a rank holds its stages at once
    out << "per rank (its stages replayed together):";
    const std::vector<int64_t> peaks = rank_peak_bytes(true);
    for (size_t r = 0; r < peaks.size(); ++r)
      out << (r ? ", " : " ") << r << ": " << format_bytes(static_cast<double>(peaks[r]));
    out << "\n";
  }
  if (const std::string late = late_swapping_stages(*this); !late.empty())
    out << "stage(s) " << late << " bring every swapped tensor back only when its backward needs it; the memopt "
        << "column is the wait for those copies\n";
  if (options.data_parallel > 1) {
    double allreduce = 0;
    for (const StagePlan& s : stages) allreduce = std::max(allreduce, s.allreduce_ms);
    const double samples = static_cast<double>(options.data_parallel * options.micro_batches * micro_batch_size);
    std::snprintf(line, sizeof line,
                  "data parallel %d x %zu stages: replicas' collectives up to %.3f ms per update (replica link %s/s%s, "
                  "drag %.2f); predicted step %.3f ms, %.1f samples/s over %lld samples\n",
                  options.data_parallel, stages.size(), allreduce,
                  format_bytes(options.replica_link_bandwidth()).c_str(),
                  options.replica_bandwidth > 0 ? "" : ", the link bandwidth: not measured", options.replica_drag,
                  step_ms(), samples / (step_ms() / 1e3), static_cast<long long>(samples));
    out << line;
  }
}

}  // namespace dawnpiper
