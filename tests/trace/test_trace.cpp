// Traces: HDF5 round trip, refusal of other files, and the per-stage summary inspect prints.
#include <catch2/catch.hpp>

#include <cstdio>
#include <sstream>

#include "profile/profile.h"
#include "trace/trace.h"
#include "util/error.h"

using namespace dawnpiper;

namespace {
ActionRecord record(int stage, ActionKind kind, int64_t mb, double start, double end, int64_t peak) {
  ActionRecord r;
  r.stage = stage;
  r.kind = static_cast<int64_t>(kind);
  r.micro_batch = mb;
  r.start_s = start;
  r.end_s = end;
  r.cpu_s = 0.75 * (end - start);  // a core shared with another rank a quarter of the time
  r.peak_bytes = peak;
  r.live_bytes = peak / 2;
  if (kind == ActionKind::SendActivation) r.bytes_sent = 1000;
  if (kind == ActionKind::RecvActivation) r.bytes_received = 1000;
  return r;
}

Trace two_stages() {
  Trace t;
  t.model = "gpt2";
  t.preset = "gpt2-tiny";
  t.graph_hash = "0123456789abcdef";
  t.schedule = "gpipe";
  t.device = "cpu";
  t.transport = "mpi";
  t.stages = 2;
  t.micro_batch_size = 4;
  t.micro_batches = 1;
  t.steps = 1;
  t.wall_s = 4.0;
  t.actions = {record(0, ActionKind::Forward, 0, 0, 1, 100),        record(0, ActionKind::SendActivation, 0, 1, 1, 100),
               record(0, ActionKind::RecvGrad, 0, 1, 3, 100),       record(0, ActionKind::Backward, 0, 3, 4, 150),
               record(1, ActionKind::RecvActivation, 0, 0, 1, 10),  record(1, ActionKind::Forward, 0, 1, 2, 60),
               record(1, ActionKind::Backward, 0, 2, 3, 80),        record(1, ActionKind::SendGrad, 0, 3, 3, 80),
               record(1, ActionKind::OptimizerStep, -1, 3, 3.5, 80)};
  for (int s = 0; s < 2; ++s) {
    StageRecord r;
    r.stage = r.rank = s;
    r.predicted_peak_bytes = 120;
    r.measured_peak_bytes = s == 0 ? 150 : 80;
    std::snprintf(r.host, sizeof r.host, "node%d", s);
    t.stage_records.push_back(r);
  }
  return t;
}
}  // namespace

TEST_CASE("traces round-trip through HDF5", "[trace]") {
  const std::string path = "test_trace_roundtrip.h5";
  const Trace t = two_stages();
  write_trace(t, path);
  const Trace u = read_trace(path);
  std::remove(path.c_str());
  CHECK(u.preset == t.preset);
  CHECK(u.graph_hash == t.graph_hash);
  CHECK(u.schedule == t.schedule);
  CHECK(u.stages == 2);
  CHECK(u.wall_s == t.wall_s);
  REQUIRE(u.actions.size() == t.actions.size());
  for (size_t i = 0; i < t.actions.size(); ++i) {
    CHECK(u.actions[i].kind == t.actions[i].kind);
    CHECK(u.actions[i].micro_batch == t.actions[i].micro_batch);
    CHECK(u.actions[i].start_s == t.actions[i].start_s);
    CHECK(u.actions[i].end_s == t.actions[i].end_s);
    CHECK(u.actions[i].cpu_s == t.actions[i].cpu_s);
    CHECK(u.actions[i].bytes_sent == t.actions[i].bytes_sent);
    CHECK(u.actions[i].peak_bytes == t.actions[i].peak_bytes);
  }
  REQUIRE(u.stage_records.size() == 2);
  CHECK(std::string(u.stage_records[1].host) == "node1");
  CHECK(u.stage_records[0].measured_peak_bytes == 150);
  CHECK_THROWS_AS(read_trace("no-such-trace.h5"), ConfigError);
}

TEST_CASE("the summary separates compute from communication and waiting", "[trace]") {
  const Trace t = two_stages();
  const auto s = summarize(t);
  REQUIRE(s.size() == 2);
  CHECK(s[0].busy_s == Approx(2.0));  // F and B
  CHECK(s[0].comm_s == Approx(2.0));  // the receive waited 2 s
  CHECK(s[0].idle_fraction == Approx(0.5));
  CHECK(s[0].peak_bytes == 150);
  CHECK(s[0].bytes_sent == 1000);
  CHECK(s[1].busy_s == Approx(2.5));  // F, B and the optimizer step
  CHECK(s[0].busy_cpu_s == Approx(1.5));
  CHECK(s[1].busy_cpu_s == Approx(1.875));
  CHECK(s[1].mean_forward_ms == Approx(1000));
  CHECK(throughput(t) == Approx(1.0));  // 4 samples in 4 s
  // The recorded lists with 1 s passes and a 0.5 s update: stage 1 waits for stage 0's forward,
  // stage 0 for stage 1's backward; stage 0 busy 2 of 4 s, stage 1 2.5.
  const std::optional<TimedRun> bound = schedule_bound(t);
  REQUIRE(bound);
  CHECK(bound->step_ms == Approx(4000));
  CHECK(bound->idle_ms[1] == Approx(1500));
  std::ostringstream out;
  print_summary(t, out);
  CHECK(out.str().find("take 4.000 s (mean efficiency 56.2%)") != std::string::npos);
  Trace cut = t;  // a run stopped before stage 1 sent its gradient back: no whole lists
  cut.actions.erase(cut.actions.begin() + 7);
  CHECK_FALSE(schedule_bound(cut));
  CHECK(out.str().find("busy CPU time per stage: 1.500 s 1.875 s; spread 25.0%") != std::string::npos);
  CHECK(out.str().find("--calibrate-trace") != std::string::npos);  // busy 2.0 s and 2.5 s: 25% apart
  // Where each stage's time goes, largest first: stage 0's receive waited 2 s.
  CHECK(out.str().find("  stage 0: RECV_B 2000.0 ms (1 x 2000.00 ms) F 1000.0 ms (1 x 1000.00 ms) B 1000.0 ms") !=
        std::string::npos);
  CHECK(out.str().find("  stage 1: F 1000.0 ms (1 x 1000.00 ms) B 1000.0 ms (1 x 1000.00 ms) RECV_F 1000.0 ms (1 x "
                       "1000.00 ms) U 500.0 ms (1 x 500.00 ms) SEND_B 0.0 ms") != std::string::npos);
  Trace gpu = t;  // a GPU's actions return before their kernels finish: no CPU time line
  gpu.device = "cuda:0";
  std::ostringstream gpu_out;
  print_summary(gpu, gpu_out);
  CHECK(gpu_out.str().find("busy CPU time") == std::string::npos);
}

// What a traced run measured of each stage, for planning from it (plan/calibrate.h).
TEST_CASE("a trace measures each stage's forward and backward per micro-batch", "[trace][calibrate]") {
  Trace t = two_stages();
  t.stage_records[0].node_begin = 0, t.stage_records[0].node_end = 5;
  t.stage_records[1].node_begin = 5, t.stage_records[1].node_end = 9;
  // One step: its forwards and backwards, wall time (GPU) or CPU time (CPU traces).
  std::vector<StageCompute> wall = measured_stage_compute(t, false);
  REQUIRE(wall.size() == 2);
  CHECK(wall[0].node_begin == 0);
  CHECK(wall[1].node_end == 9);
  CHECK(wall[0].ms == Approx(2000));  // F 1 s + B 1 s, one micro-batch; the receive's wait is not work
  CHECK(wall[1].ms == Approx(2000));  // the optimizer step is not per micro-batch work
  CHECK(measured_stage_compute(t, true)[0].ms == Approx(1500));
  // A later step leaves the first (first touches of memory) out; evictor records nested in a
  // backward come off it.
  Trace two = t;
  two.steps = 2;
  for (const ActionRecord& r : t.actions) {
    ActionRecord later = r;
    later.step = 1, later.start_s += 10, later.end_s += 10;
    if (later.action_kind() == ActionKind::Backward && later.stage == 1)  // 3 s, 0.5 s of it a re-run
      later.end_s += 2, later.cpu_s = 0.75 * 3;
    two.actions.push_back(later);
  }
  ActionRecord rerun = record(1, ActionKind::Recompute, 0, 12, 12.5, 0);
  rerun.step = 1;
  two.actions.push_back(rerun);
  ActionRecord swap_in = record(1, ActionKind::SwapIn, 0, 12.1, 12.2, 0);  // the re-run waits for it: inside
  swap_in.step = 1;
  two.actions.push_back(swap_in);
  ActionRecord at_send = record(0, ActionKind::SwapOut, 0, 11, 11, 0);  // inside a send, not a forward
  at_send.step = 1, at_send.end_s = 11.2;
  two.actions.push_back(at_send);
  const std::vector<StageCompute> later = measured_stage_compute(two, false);
  CHECK(later[0].ms == Approx(2000));
  CHECK(later[1].ms == Approx(1000 + 3000 - 500));
  // In CPU time, the re-run's wall time at the backward's CPU time per wall second.
  CHECK(measured_stage_compute(two, true)[1].ms == Approx(0.75 * (1000 + 3000) - 0.75 * 500));
  // CPU time measures the work where each action used about one core; not with several
  // threads' time in it, nor on a GPU.
  CHECK(cpu_time_is_work(two));
  Trace threads = two;
  for (ActionRecord& r : threads.actions) r.cpu_s = 2 * (r.end_s - r.start_s);
  CHECK_FALSE(cpu_time_is_work(threads));
  Trace gpu = two;
  gpu.device = "cuda:0";
  CHECK_FALSE(cpu_time_is_work(gpu));
  // Without a stage's backward there is nothing to measure.
  Trace missing = t;
  missing.actions.erase(missing.actions.begin() + 3);  // stage 0's backward
  CHECK_THROWS_AS(measured_stage_compute(missing, false), ConfigError);
  Trace old = t;  // a trace from before CPU times were recorded
  for (ActionRecord& r : old.actions) r.cpu_s = 0;
  CHECK_THROWS_AS(measured_stage_compute(old, true), ConfigError);
}

// train --profile-in and --calibrate-trace refuse a measured profile of another device type
// (its times are that device's); analytic profiles and older files without a device pass.
TEST_CASE("a measured profile stands only for runs on its device type", "[profile]") {
  Profile p;
  p.source = ProfileSource::Measured;
  p.device = "cpu";
  CHECK(p.device_mismatch("cpu").empty());
  CHECK(p.device_mismatch("cuda:0") == "the profile was measured on cpu, the run is on cuda:0 (profile on cuda)");
  p.device = "cuda:0";
  CHECK(p.device_mismatch("cuda:3").empty());  // the same device type, another index
  CHECK(p.device_mismatch("cpu").find("measured on cuda:0, the run is on cpu") != std::string::npos);
  CHECK(p.device_mismatch("").empty());
  p.source = ProfileSource::Analytic;
  p.device = "a100-40gb";
  CHECK(p.device_mismatch("cpu").empty());
}
