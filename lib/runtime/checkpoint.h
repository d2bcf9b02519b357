#pragma once
// Checkpoints of a pipeline run: every stage writes its parameters, optimizer state and the next
// step to DIR/step-<k>/stage-<x>.h5 (temporary name, then rename); when all stages have written,
// rank 0 points DIR/latest at step k (again atomically) and removes older steps. A crash at any
// moment leaves `latest` naming a complete checkpoint. Resuming reads `latest`.
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/pipeline_stage.h"

namespace dawnpiper {

// What a checkpoint must match to be resumed: the model's node count and preset, the stage's
// node range and the optimizer.
struct CheckpointIdentity {
  std::string preset, optimizer;
  int64_t nodes = 0, stages = 0;
};

// Collective over `comm` (every rank calls it with its stages after the same step): a file per
// stage. `next_step`: the first step a resumed run trains. Under ZeRO (stages with a
// zero_shard()) every replica calls it, collective over `replicas` too (this stage's replicas,
// rank = replica): replica 0 writes stage-<x>.h5 with the parameters and its shard of the
// optimizer state, replica r > 0 stage-<x>-replica-<r>.h5 with its shard alone.
void write_checkpoint(const std::string& dir, int64_t next_step, const std::vector<PipelineStage*>& stages,
                      const CheckpointIdentity& id, MPI_Comm comm, MPI_Comm replicas = MPI_COMM_NULL);

// The step `latest` names (the first step to train); throws ConfigError if there is none.
int64_t latest_checkpoint(const std::string& dir);

// Loads this stage's parameters and optimizer state of checkpoint `step` (under ZeRO its
// replica's shard of the state); throws ConfigError when the checkpoint belongs to another model,
// split, optimizer, or sharding level and replica count.
void read_checkpoint(const std::string& dir, int64_t step, PipelineStage& stage, const CheckpointIdentity& id);

}  // namespace dawnpiper
