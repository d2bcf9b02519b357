#pragma once
// What a resumed `train` run must repeat of the run that wrote its checkpoint: DIR/run.json,
// written beside the checkpoints (run/agreed_plan.h) and checked on --resume.
#include <functional>
#include <optional>

#include "cli/train_options.h"
#include "graph/op_graph.h"
#include "util/json.h"

namespace dawnpiper {

// One sample's data: each input's role and shape without the micro-batch dimension ("tokens
// [32], tokens_next [32]"), which --seq-len or --image-size change and the model's fingerprint
// (its ops and parameter shapes) does not see.
std::string sample_shape(const OpGraph& graph);
// By option name: the model (its fingerprint and sample shape) and data, and (with_training) how it trains (--steps
// only where the schedule decays to the last step). Evaluation reads only the first part.
Json run_identity(const OpGraph& graph, const TrainOptions& o, bool with_training);
// DIR/run.json of --checkpoint-dir, if there is one.
std::optional<Json> saved_run(const TrainOptions& o);
// Collective over MPI_COMM_WORLD: the step a resumed run starts from (--resume-from's, or the one
// `latest` names), its checkpoint checked file by file on rank 0 (runtime/checkpoint.h) before
// anything is printed; every rank throws the same ConfigError where it is missing or damaged.
int64_t agreed_resume_step(const std::string& dir, int64_t requested, int rank);

// Collective over MPI_COMM_WORLD: runs `check` on rank 0; where it throws a ConfigError every rank
// throws the same one (the job then ends with its one line, no rank aborting alone).
void agreed_on_rank0(const std::function<void()>& check, int rank);
// Rank 0 of a resumed run from checkpoint `step`: refuses settings that differ from the
// checkpoint's run, naming each, unless --resume-override (then says what changes). The
// micro-batch size, micro-batches and replicas may change where the global batch they make
// stays (a new plan follows: run/agreed_plan.h); another global batch needs --resume-override,
// and the message says where the data goes on. Checkpoints without run.json pass.
void check_resumed_run(const OpGraph& graph, const TrainOptions& o, int64_t step);

}  // namespace dawnpiper
