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
// Rank 0 of a resumed run: refuses settings that differ from the checkpoint's run, naming each,
// unless --resume-override (then says what changes). Checkpoints without run.json pass.
void check_resumed_run(const OpGraph& graph, const TrainOptions& o);

}  // namespace dawnpiper
