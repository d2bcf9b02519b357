#pragma once
// What a resumed `train` run must repeat of the run that wrote its checkpoint: DIR/run.json,
// written beside the checkpoints (run/agreed_plan.h) and checked on --resume.
#include <optional>

#include "cli/train_options.h"
#include "graph/op_graph.h"
#include "util/json.h"

namespace dawnpiper {

// By option name: the model and data, and (with_training) how it trains (--steps only where the
// schedule decays to the last step). Evaluation reads only the first part.
Json run_identity(const OpGraph& graph, const TrainOptions& o, bool with_training);
// DIR/run.json of --checkpoint-dir, if there is one.
std::optional<Json> saved_run(const TrainOptions& o);
// Collective over MPI_COMM_WORLD: the step a resumed run starts from (--resume-from's, or the one
// `latest` names), its checkpoint checked file by file on rank 0 (runtime/checkpoint.h) before
// anything is printed; every rank throws the same ConfigError where it is missing or damaged.
int64_t agreed_resume_step(const std::string& dir, int64_t requested, int rank);
// Rank 0 of a resumed run: refuses settings that differ from the checkpoint's run, naming each,
// unless --resume-override (then says what changes). Checkpoints without run.json pass.
void check_resumed_run(const OpGraph& graph, const TrainOptions& o);

}  // namespace dawnpiper
