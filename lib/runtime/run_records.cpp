#include "runtime/run_records.h"

#include <unistd.h>

#include "runtime/stage_tracer.h"
#include "trace/trace.h"

namespace dawnpiper {

void write_pipeline_trace(const OpGraph& graph, const Plan& plan, const PipelineConfig& pc, const RankLayout& layout,
                          const StageRun& mine, MPI_Comm world, const std::string& path) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  Trace trace;
  trace.actions = gather_records(mine.actions, world);
  double wall = 0;
  MPI_Reduce(&mine.wall_s, &wall, 1, MPI_DOUBLE, MPI_MAX, 0, world);
  // One record per stage of the rank (its V stages under interleaving, which share its peak).
  const int virtual_stages = pc.schedule.virtual_stages();
  std::vector<StageRecord> mine_records;
  for (int v = 0; v < virtual_stages; ++v) {
    const int stage = v * layout.stages + layout.stage;
    const StagePlan& planned = plan.stages[static_cast<size_t>(stage)];
    StageRecord& rec = mine_records.emplace_back();
    rec.stage = stage;
    rec.rank = rank;
    rec.replica = layout.replica;
    rec.node_begin = planned.begin;
    rec.node_end = planned.end;
    for (const auto& p : mine.parameters)  // a tied copy counts on its owner's stage
      if (virtual_stages == 1 || (p.node >= planned.begin && p.node < planned.end)) rec.parameters += p.tensor.numel();
    // Under interleaving the measured peak is the rank's: so is the prediction beside it.
    rec.predicted_peak_bytes = virtual_stages > 1 ? plan.rank_peak_bytes(true)[static_cast<size_t>(layout.stage)]
                                                  : planned.memory.predicted_peak();
    rec.predicted_ms_per_micro_batch = planned.time_ms();
    rec.measured_peak_bytes = mine.peak_bytes;
    gethostname(rec.host, sizeof rec.host - 1);
  }
  const int bytes = static_cast<int>(sizeof(StageRecord)) * virtual_stages;
  std::vector<StageRecord> records(static_cast<size_t>(size * virtual_stages));
  MPI_Gather(mine_records.data(), bytes, MPI_BYTE, records.data(), bytes, MPI_BYTE, 0, world);
  if (rank != 0) return;
  trace.model = graph.model;
  trace.preset = graph.preset;
  trace.graph_hash = graph.fingerprint();
  trace.schedule = name_of(pc.schedule);
  trace.device = pc.device.str();
  trace.transport = mine.transport;
  trace.stages = static_cast<int64_t>(plan.stages.size());
  trace.virtual_stages = virtual_stages;
  trace.replicas = layout.replicas;
  trace.micro_batch_size = graph.micro_batch_size;
  trace.micro_batches = pc.micro_batches;
  trace.first_step = pc.first_step;
  trace.steps = mine.next_step;  // fewer than planned where a signal stopped the run
  trace.wall_s = wall;
  trace.stage_records = records;
  write_trace(trace, path);
}

std::vector<RankPeak> gather_peaks(const StageRun& mine, const RankLayout& layout, MPI_Comm world) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  constexpr int kFields = 6;
  const int64_t record[kFields] = {
      layout.replica,     layout.stage, mine.peak_bytes, mine.reserved_peak_bytes, mine.optimizer_state_bytes,
      mine.gathered_bytes};
  std::vector<int64_t> all(kFields * static_cast<size_t>(size));
  MPI_Gather(record, kFields, MPI_INT64_T, all.data(), kFields, MPI_INT64_T, 0, world);
  std::vector<RankPeak> peaks;
  if (rank != 0) return peaks;
  for (int r = 0; r < size; ++r) {
    const int64_t* f = &all[static_cast<size_t>(kFields * r)];
    peaks.push_back({static_cast<int>(f[0]), static_cast<int>(f[1]), f[2], f[3], f[4], f[5]});
  }
  return peaks;
}

}  // namespace dawnpiper
