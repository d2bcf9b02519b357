#include "runtime/pipeline_reductions.h"

#include <set>

#include "runtime/mpi_transport.h"
#include "runtime/mpi_wait.h"
#include "runtime/stage_tracer.h"
#include "runtime/transport.h"
#include "runtime/zero_shard.h"

namespace dawnpiper {

// Parameters held by more than one stage (weights tied across a cut), keyed by their owner
// (node, index), with the stages holding a copy, in a deterministic order.
std::map<std::pair<int, int>, std::vector<int>> tied_groups(const OpGraph& g, const PipelineConfig& c) {
  std::map<std::pair<int, int>, std::set<int>> holders;
  for (size_t s = 0; s < c.ranges.size(); ++s)
    for (int n = c.ranges[s].first; n < c.ranges[s].second; ++n)
      for (size_t i = 0; i < g.nodes[n].params.size(); ++i) {
        const ParamSpec& p = g.nodes[n].params[i];
        holders[p.tied() ? std::make_pair(p.tied_node, p.tied_param) : std::make_pair(n, int(i))].insert(int(s));
      }
  std::map<std::pair<int, int>, std::vector<int>> groups;
  for (auto& [key, stages] : holders)
    if (stages.size() > 1) groups[key] = {stages.begin(), stages.end()};
  return groups;
}

std::vector<TieComm> tie_communicators(const OpGraph& g, const PipelineConfig& c, MPI_Comm comm, int rank) {
  std::vector<TieComm> tie_comms;
  const int ranks = comm == MPI_COMM_NULL ? 1 : ranks_of(c);
  for (const auto& [key, holders] : tied_groups(g, c)) {
    std::vector<int> mine;
    for (int s : holders)
      if (s % ranks == rank) mine.push_back(s);
    MPI_Comm sub = MPI_COMM_NULL;
    if (comm != MPI_COMM_NULL) MPI_Comm_split(comm, mine.empty() ? MPI_UNDEFINED : 0, rank, &sub);
    if (!mine.empty()) tie_comms.push_back({key, mine, sub});
  }
  return tie_comms;
}

namespace {

// Sums each tied parameter's gradient over the stages holding it (REDUCE_TIED), at the first of
// its stages on this rank (a rank's tied reductions all come before its updates): the rank's
// copies summed, then over the ranks holding it, and every copy here given the sum.
void reduce_tied(const std::vector<TieComm>& tie_comms, int stage, RankStages& stages) {
  const int ranks = stages.front()->config().stages / static_cast<int>(stages.size());
  for (const TieComm& tie : tie_comms) {
    if (tie.stages.front() != stage) continue;
    // Level 0 averages the copies over the replicas first (their averaging started when the
    // backwards ended; the sum of means is the mean of sums). ZeRO reduce-scatters the sums.
    for (int s : tie.stages)
      if (PipelineStage& holder = *stages[static_cast<size_t>(s / ranks)]; !holder.zero_shard())
        holder.average_replicas();
    std::vector<at::Tensor*> copies;
    for (int s : tie.stages)
      for (auto& p : stages[static_cast<size_t>(s / ranks)]->module().parameters())
        if (p.node == tie.key.first && p.index == tie.key.second) {
          if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
          copies.push_back(&p.tensor.mutable_grad());
        }
    // Summed in host memory (MPI is not assumed CUDA-aware); with one copy on the CPU, in place.
    at::Tensor sum = copies.front()->to(at::kCPU).contiguous();
    if (copies.size() > 1) sum = sum.clone();
    for (size_t k = 1; k < copies.size(); ++k) sum += copies[k]->to(at::kCPU);
    if (tie.comm != MPI_COMM_NULL)
      allreduce_chunked_quietly(sum.data_ptr(), sum.numel(), MPI_FLOAT, MPI_SUM, tie.comm, kMessageChunkBytes);
    for (size_t k = 0; k < copies.size(); ++k)  // each copy its own tensor: backwards accumulate into it
      *copies[k] = (k == 0 ? sum : sum.clone()).to(copies[k]->device());
  }
}

}  // namespace

std::unique_ptr<ReplicaAverager> attach_replica_averager(PipelineStage& stage, const PipelineConfig& c,
                                                         const RunConfig& options, StageTracer* const& tracing) {
  const int x = stage.config().program.stage;
  // Traced: each reduction from its start until seen complete (its bucket as the tensor).
  auto flight = [x, &tracing](int bucket, int64_t bytes, StageTracer::Clock::time_point start,
                              StageTracer::Clock::time_point end) {
    if (tracing) tracing->record_nested(x, ActionKind::AllReduce, -1, bucket, bytes, start, end);
  };
  if (ZeroShard* zero = stage.zero_shard()) {  // ZeRO: reduce-scattered into the replica's shard
    zero->set_listener(flight);
    stage.set_replica_reducer([zero, x, &tracing](std::vector<StageParameter>&) {
      const auto start = StageTracer::Clock::now();
      const int64_t bytes = zero->reduce_scatter();
      if (tracing) tracing->record_nested(x, ActionKind::AllReduce, -1, -1, bytes, start, StageTracer::Clock::now());
    });
    return nullptr;
  }
  // Level 0: in buckets, those holding a weight tied across stages started when the backward ends.
  std::vector<bool> deferred;
  const auto tied = tied_groups(stage.module().graph(), c);
  for (const StageParameter& p : stage.module().parameters()) deferred.push_back(tied.count({p.node, p.index}) > 0);
  std::unique_ptr<ReplicaAverager> averager =
      make_replica_averager(options.replica_comm, c.device, stage.module().parameters(), c.bucket_bytes,
                            std::move(deferred), stage.config().program.splits_backward());
  ReplicaAverager* a = averager.get();
  stage.set_replica_pass([a](bool last) { a->begin_pass(last); });
  stage.set_replica_starter([a](std::vector<StageParameter>& params) { a->start(params); });
  a->set_listener(flight);
  // Traced: what the update waits for (the averaging started after the step's last backward).
  stage.set_replica_reducer([a, x, &tracing](std::vector<StageParameter>& params) {
    const auto start = StageTracer::Clock::now();
    const int64_t bytes = a->average(params);
    if (tracing) tracing->record_nested(x, ActionKind::AllReduce, -1, -1, bytes, start, StageTracer::Clock::now());
  });
  return averager;
}

void attach_reducers(RankStages& stages, const std::vector<TieComm>& tie_comms, const PipelineConfig& c, MPI_Comm comm,
                     std::shared_ptr<std::pair<int, double>> norm) {
  for (auto& stage : stages) {
    const int x = stage->config().program.stage;
    if (c.schedule.traits().updates_once_per_step && !tie_comms.empty())
      stage->set_tied_reducer(
          [&tie_comms, &stages, x](std::vector<StageParameter>&) { reduce_tied(tie_comms, x, stages); });
    stage->set_norm_reducer([&stages, norm, comm] {
      auto& [updates, square_sum] = *norm;
      if (updates++ % static_cast<int>(stages.size()) == 0) {
        square_sum = 0;
        for (auto& s : stages) s->average_replicas(), square_sum += s->grad_square_sum();
        if (comm != MPI_COMM_NULL) allreduce_quietly(&square_sum, 1, MPI_DOUBLE, MPI_SUM, comm);
      }
      return square_sum;
    });
  }
}

}  // namespace dawnpiper
