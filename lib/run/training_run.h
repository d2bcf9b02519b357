#pragma once
// One `train` run from its options: this rank's place and device, the graph, then the reference
// trainer (one plain stage) or the pipeline runtime on the agreed plan (run/agreed_plan.h), with
// resumption, evaluation, signals, weights and traces. SPMD: every rank calls it.
#include <optional>

#include "cli/train_options.h"
#include "models/model_source.h"
#include "run/agreed_plan.h"

namespace dawnpiper {

// The process's exit code: 0, or 128 + the signal that stopped the run.
int run_training(TrainOptions o, const ModelSource& source, const std::optional<GivenPlan>& given, int rank,
                 int world_size);

}  // namespace dawnpiper
