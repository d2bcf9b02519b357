#pragma once
// Checkpoints of a pipeline run: every stage writes its parameters (with their names and shapes),
// optimizer state and the next step to DIR/step-<k>/stage-<x>.h5 (temporary name, then rename);
// when all stages have written, rank 0 writes DIR/step-<k>/manifest.json (every file's size and
// checksum: the mark of a complete checkpoint; and the index: per parameter name, which file
// holds it and which slices of its optimizer state each file holds, so that a run on another
// layout reads just what it needs), points DIR/latest at step k (each atomically)
// and removes what is older than the last K complete checkpoints. A crash at any moment leaves
// `latest` naming a complete checkpoint. Resuming reads `latest`, or the step asked for, after
// checking every file against the manifest.
#include <mpi.h>

#include <cstdint>
#include <string>
#include <utility>
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
// `keep`: how many complete checkpoints stay (--keep-checkpoints; this one among them): this one
// and those it follows (its manifest names the one before it on the run's line, which `latest`
// named); other step directories (older ones, any past this step, and those of a line abandoned
// at --resume-from) are removed once it is complete.
void write_checkpoint(const std::string& dir, int64_t next_step, const std::vector<PipelineStage*>& stages,
                      const CheckpointIdentity& id, MPI_Comm comm, MPI_Comm replicas = MPI_COMM_NULL, int keep = 2);

// The step a resumed run starts from: `requested` (--resume-from; < 0: the one `latest` names),
// once every file of that checkpoint is present with the size and checksum its manifest gives
// (a checkpoint from before manifests, which `latest` names, passes unchecked). Otherwise a
// ConfigError of one line that names the missing or damaged file (or `latest` itself) and the
// newest complete earlier checkpoint with the option that resumes from it. Reads files only:
// rank 0 calls it before anything else.
int64_t checked_resume_step(const std::string& dir, int64_t requested);

// Whether checkpoint `step` in `dir` resumes on any layout (its manifest indexes every tensor
// and slice): any split, data-parallel width and sharding level.
bool checkpoint_moves(const std::string& dir, int64_t step);

// Where checkpoint `step`'s index (checkpoint_moves) disagrees with a model's parameters (name
// and shape each): "holds no parameter N" or "holds N with shape [..], this model's is [..]" for
// the first that differs, or a tensor the model lacks; "" where they agree or there is no index.
std::string checkpoint_parameter_mismatch(const std::string& dir, int64_t step,
                                          const std::vector<std::pair<std::string, std::vector<int64_t>>>& params);

// The steps of DIR's complete checkpoints (a step directory with its manifest), newest first.
std::vector<int64_t> complete_checkpoints(const std::string& dir);

// Rank 0 of a resumed run, before it trains from checkpoint `step`: points DIR/latest at it
// (where it names another, e.g. a damaged newer step passed by --resume-from), so that the run's
// checkpoints follow it and keep K of its own line; the newer ones it abandons are removed when
// it writes its first.
void continue_from_checkpoint(const std::string& dir, int64_t step);

// DIR/step-<k>: where checkpoint k's files are.
std::string checkpoint_step_dir(const std::string& dir, int64_t step);

// What is wrong with checkpoint `step` in `dir` ("" when nothing): its directory, manifest, or a
// file missing, of another size or checksum than written. `unchecked_ok`: a step directory without
// a manifest passes (a checkpoint written before manifests).
std::string checkpoint_damage(const std::string& dir, int64_t step, bool unchecked_ok = false);

// One parameter of a checkpoint: its model name, shape and float32 values.
struct CheckpointTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};
// The parameters of checkpoint `step` in `dir`, every stage's in stage order, each name once (a
// tied weight from the lowest stage holding it): what --save-weights writes at that step.
// Throws ConfigError naming the file when one is missing, damaged or from before checkpoints kept
// shapes.
std::vector<CheckpointTensor> checkpoint_parameters(const std::string& dir, int64_t step);

// Loads this stage's parameters and optimizer state of checkpoint `step` (under ZeRO its
// replica's shard of the state). A checkpoint with an index in its manifest (checkpoint_moves)
// is read on any layout: each parameter by its model name, and each tensor the optimizer
// updates (a whole parameter, or a piece of a ZeRO shard) from the slices of the written state
// that overlap it, whatever split, replica count and sharding level wrote them. One written
// before the index: without sharding by name from whichever stage file holds a parameter; sharded,
// only on its own split, level and replica count. Throws ConfigError when the checkpoint belongs
// to another model or optimizer, or cannot serve this layout.
void read_checkpoint(const std::string& dir, int64_t step, PipelineStage& stage, const CheckpointIdentity& id);

}  // namespace dawnpiper
