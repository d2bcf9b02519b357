#pragma once
// The partitioners DawnPiper is compared with, in the same cost model so that their plans run on
// the same runtime and their predictions are comparable. Block granularity means the units are
// maximal runs of nodes with the same NodeProfile::block (layers / cells).
//  even       equal numbers of blocks per stage (earlier stages take the remainder).
//  gpipe      torchgpipe's balance_by_time: Barany's block partition heuristic
//             (torchgpipe/balance/blockpartition.py) over per-block fwd+bwd times. Memory-blind;
//             its r/sr work on whole blocks (GPipe re-materializes layers).
//  pipedream  PipeDream's dynamic program for a straight pipeline: minimize the slowest stage,
//             a stage's time being max(compute, activation+gradient transfer at its input).
//             Memory-blind; the memory optimizer and the capacity check come after.
//  vpipe      vPipe: a time-balanced block partition, block-granularity swap/recompute, and a
//             Kernighan-Lin refinement that moves boundary blocks between neighbours while it
//             lowers (capacity overflow, slowest stage).
//  exact      the optimum over all node-granularity cut positions with the stage memory
//             optimizer: a DP over (stage, cut), stages evaluated best bound first. The
//             yardstick for BiPar.
#include <limits>
#include <vector>

#include "plan/stage_evaluator.h"

namespace dawnpiper {

// Node positions where blocks start, plus the end: [0, ..., n].
std::vector<int> block_boundaries(const CostModel& model);

// The block-granularity planners throw ConfigError when there are fewer blocks than stages.
Bounds even_partition(const CostModel& model);
Bounds gpipe_partition(const CostModel& model);
Bounds pipedream_partition(const CostModel& model);
// `block_evaluator` must use MemoptGranularity::Block. Empty when no refinement fits.
Bounds vpipe_partition(StageEvaluator& block_evaluator);

// Empty when no partition fits, or none whose slowest stage is faster than `below`.
Bounds exact_partition(StageEvaluator& evaluator, double below = std::numeric_limits<double>::infinity());

// Memopt none: among the partitions whose slowest stage takes at most `bottleneck` and whose
// stages fit `capacity` by the cost model's formula, the one with the least sum of squared stage
// times (evenly loaded stages). Empty when there is none.
Bounds balanced_partition(const CostModel& model, int64_t capacity, double bottleneck);

// torchgpipe's blockpartition.solve: sizes of `partitions` consecutive groups of `costs`.
std::vector<int> barany_block_partition(const std::vector<double>& costs, int partitions);

}  // namespace dawnpiper
