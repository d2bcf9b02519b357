#pragma once
// What a rank's stages reduce before their updates, the same for an MPI run and for the
// in-process run (every stage in one process, its communicators MPI_COMM_NULL): the gradients of
// weights tied across stages summed at their ReduceTiedGrads, the global gradient norm summed
// over the stages at the first update of a step, and with data parallelism each stage's
// gradients averaged over its replicas (level 0) or reduce-scattered into its shard (ZeRO).
#include <mpi.h>

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/pipeline.h"
#include "runtime/replica_averager.h"

namespace dawnpiper {

class StageTracer;

// Parameters held by more than one stage (weights tied across a cut), keyed by their owner
// (node, index), with the stages holding a copy, in a deterministic order.
std::map<std::pair<int, int>, std::vector<int>> tied_groups(const OpGraph& graph, const PipelineConfig& config);

// The stages a process runs: one per rank, an interleaved schedule's V (stage v * ranks + rank
// at v), or in one process every stage.
using RankStages = std::vector<std::unique_ptr<PipelineStage>>;

// One communicator per group of ranks sharing a tied parameter (key: owner node, parameter
// index), with the stages on this rank holding it (two where interleaving puts both on one
// rank); every rank takes part in every split, in the same order. comm MPI_COMM_NULL: every
// stage is in this process, and nothing crosses one.
struct TieComm {
  std::pair<int, int> key;
  std::vector<int> stages;  // this rank's, ascending
  MPI_Comm comm;
};
std::vector<TieComm> tie_communicators(const OpGraph& graph, const PipelineConfig& config, MPI_Comm comm, int rank);

// Each stage's tied reducer (under schedules that update once per step) and norm reducer: the
// tied copies on this rank summed, then over `comm`; the squared norms summed over the rank's
// stages (each averaged over its replicas first) at the first update of a step and over `comm`
// (MPI_COMM_NULL: this process only), kept in `norm` for the step's other updates.
void attach_reducers(RankStages& stages, const std::vector<TieComm>& tie_comms, const PipelineConfig& config,
                     MPI_Comm comm, std::shared_ptr<std::pair<int, double>> norm);

// Data parallelism: the stage averages its gradients with its replicas before each update, each
// averaging traced (through `tracing`, once the tracer exists) as an AllReduce.
std::unique_ptr<ReplicaAverager> attach_replica_averager(PipelineStage& stage, const PipelineConfig& config,
                                                         const RunConfig& options, StageTracer* const& tracing);

}  // namespace dawnpiper
