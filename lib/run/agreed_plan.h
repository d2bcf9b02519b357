#pragma once
// The plan every rank of a `train` run executes: the one given with --plan-in, a resumed run's
// saved one, or one rank 0 makes from a profile (read, cached or measured here), broadcast to
// every rank and checked against the run. Collective over MPI_COMM_WORLD.
#include <cstdint>
#include <optional>
#include <string>

#include "cli/train_options.h"
#include "graph/op_graph.h"
#include "plan/plan.h"
#include "runtime/pipeline.h"
#include "runtime/rank_layout.h"

namespace dawnpiper {

// A plan given with --plan-in: its text (every rank has it) and what it says.
struct GivenPlan {
  std::string json;
  Plan plan;
};
// Read on rank 0 and broadcast; nothing without a path.
std::optional<GivenPlan> read_given_plan(const std::string& path, int rank);
// The plan a checkpoint directory keeps (DIR/plan.json), whose settings a resumed run takes
// where it gives none (adopt_plan_settings); nothing where there is none.
std::optional<GivenPlan> read_checkpoint_plan(const std::string& dir, int rank);

// The given plan, or rank 0's; written to --plan-out and, with --checkpoint-dir, beside the
// checkpoints with the run's identity (run/resume.h). A resumed run keeps its checkpoint's plan
// where it asks for nothing that plan was not made for (stage and replica count, schedule,
// planner, memopt, micro-batching, optimizer, sharding, a given --device-memory) and the plan's
// predicted peaks fit the memory; otherwise rank 0 says why and plans anew (each stage then reads
// its tensors by name), or refuses where the checkpoint is sharded and has no index.
Plan agreed_plan(const std::optional<GivenPlan>& given, const OpGraph& graph, const RankLayout& layout,
                 const TrainOptions& o, c10::Device device, int rank);

// What a resumed run asks of its checkpoint's plan (`saved`) that it was not made for, as
// "--option old -> new" items, or that its predicted peak is above the memory a rank may fill
// now; "" where the saved plan serves.
std::string resumed_plan_changes(const Plan& saved, const OpGraph& graph, const TrainOptions& o,
                                 const RankLayout& layout, c10::Device device);

// What the runtime builds this rank's stage with.
PipelineConfig pipeline_config(const Plan& plan, const OpGraph& graph, const RankLayout& layout, const TrainOptions& o,
                               c10::Device device, int64_t first_step);

}  // namespace dawnpiper
