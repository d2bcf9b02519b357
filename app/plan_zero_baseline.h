#pragma once
// `dawnpiper plan --planner zero2|zero3`: ZeRO's data-parallel baseline (plan/zero_baseline.h)
// over --data-parallel D GPUs, each training the whole model (one stage) on its own batch.
#include "cli/options.h"
#include "plan/plan_options.h"
#include "profile/profile.h"

namespace dawnpiper {

// The options that have no meaning for pure data parallelism, refused before any profiling
// (ConfigError, one line): --stages above 1, --virtual-stages above 1, --micro-batches other than
// 1 (ZeRO's global batch is D x the per-GPU micro-batch), --memopt r|sr, --zero-stage (the
// planner is the level), --out (no pipeline plan to write), --calibrate-*. --schedule is
// ignored: one stage training one micro-batch a step runs the same under every schedule.
void refuse_for_zero_baseline(const po::variables_map& vm);
// Prints the baseline at --micro-batch-size (InfeasibleError when its peak exceeds the
// capacity) or, with --max-batch, the largest per-GPU micro-batch and global batch. Returns the
// exit code.
int plan_zero_baseline(const po::variables_map& vm, const Profile& profile, const PlanSettings& options);

}  // namespace dawnpiper
