#pragma once
// The planner's entry points, used by `dawnpiper plan` and by rank 0 before training.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "profile/profile.h"

namespace dawnpiper {

// The planner of one schedule (`options.schedule`, resolved); a PlanRequest, which may ask for
// `--schedule auto`, is resolved by plan/schedule_search.h.
//
// The best plan `options.planner` finds for the profile at its micro-batch size. Throws
// ConfigError for stages < 1, more stages
// than nodes (or blocks, for block-granularity planners), and InfeasibleError when no plan fits
// the capacity; that message names the smallest capacity with which the planner succeeds at
// this micro-batch size and, when the profile has batch-size fits, the largest micro-batch size
// that fits the given capacity.
Plan make_plan(const Profile& profile, const PlanOptions& options);

// As make_plan, but returns nothing instead of throwing InfeasibleError (no message search).
std::optional<Plan> try_plan(const Profile& profile, const PlanOptions& options);
// Why a schedule splitting its backwards (I and W) cannot run `plan`, or "": a stage holding a
// weight's owner and a reader of it that the owner feeds (GPT-2's tied embedding and output
// projection); W of the reader would count the owner's part too. The runtime refuses such a
// stage as well (exec/split_backward.h); make_plan throws ConfigError with this.
std::string split_backward_refusal(const Profile& profile, const Plan& plan);

struct MaxBatch {
  int64_t micro_batch_size = 0;
  Plan plan;
};

// The largest micro-batch size B <= upper_bound with a feasible plan, evaluating the profile at
// each B through its batch-size fits (Profile::at_batch): doubling until a B fails, binary
// search, then on above the answer until four sizes in a row fail (feasibility is not quite
// monotone in B). `threads` plans the sizes the search may need next at once (0: one per core
// this process may use, at most 8); the answer does not depend on it. Throws InfeasibleError when even
// B = 1 does not fit, ConfigError when the profile has no batch-size fits or upper_bound < 1.
MaxBatch find_max_batch(const Profile& profile, const PlanOptions& options, int64_t upper_bound = 4096,
                        int threads = 0);
// The same search with `plan_at` planning the profile at each size (a request's candidates,
// plan/schedule_search.h); `options` are checked and word the message when nothing fits.
using PlanAtBatch = std::function<std::optional<Plan>(const Profile& at_batch)>;
MaxBatch find_max_batch(const Profile& profile, const PlanOptions& options, const PlanAtBatch& plan_at,
                        int64_t upper_bound, int threads);

}  // namespace dawnpiper
