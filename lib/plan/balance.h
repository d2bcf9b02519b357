#pragma once
// Cuts between two adjacent stage groups (Alg. 1 generalized) and the communication
// optimization of appendix B.2.
//
// A range [b, e) is to be split into a first group of k stages and a second of s - k stages
// (stage indices x0 .. x0+s-1). Cut positions are node indices: cut c puts nodes [b, c) in the
// first group. Every stage keeps at least one node, so c lies in [b + k, e - (s - k)].
#include "plan/cost_model.h"

namespace dawnpiper {

// rho_cb: where the first group's share k/s of the compute time is reached (Alg. 1 accumulating
// time in execution order); of the two positions around that point, the one with the smaller
// max(T_first / k, T_second / (s - k)).
int compute_balanced_cut(const CostModel& model, int b, int e, int k, int s);

// rho_mb: where the two groups' peaks meet, each group's stages peaking equally
// (CostModel::balanced_group_peak: weights times the simulated weight versions, optimizer
// state, in-flight micro-batches times activations). Earlier stages hold more micro-batches in
// 1F1B and async, so this cut lies left of rho_cb there. Without memory optimization.
int memory_balanced_cut(const CostModel& model, int b, int e, int x0, int k, int s);

// A lower bound on the slowest stage of any split at `cut`: memory optimization only adds time,
// so neither group can beat its average compute time.
double split_lower_bound(const CostModel& model, int b, int cut, int e, int k, int s);

// Appendix B.2. Tensors that cross every cut the search might use here -- the searched interval
// [lo, hi] and the reach of the adjustment around the cut (BERT's embedding output, an attention
// mask) -- must be sent whatever the cut and are ignored. Of the rest:
//  - a cut whose traffic (activations forward plus gradients back, per micro-batch, over the
//    stage link) takes longer than an average stage computes breaks the theorem's condition 2
//    and is skipped;
//  - a cut where several tensors cross moves to a nearby cut (within `window` nodes and
//    `max_shift` of an average stage's compute time) where a single tensor of no more bytes
//    crosses: "send only the lowest common node's output" -- when the compute it moves from one
//    stage to the other takes less time than the traffic it saves (activations and gradients).
struct CommOptimization {
  bool enabled = true;
  int window = 8;
  double max_shift = 0.05;
};

// The cut to try instead of `cut` (itself when fine), or -1 to skip it. [lo, hi] is the searched
// interval, [min_cut, max_cut] the allowed one, avg_stage_ms the range's compute time per stage.
int adjust_cut(const CostModel& model, int cut, int lo, int hi, int min_cut, int max_cut, double avg_stage_ms,
               const CommOptimization& options);

}  // namespace dawnpiper
