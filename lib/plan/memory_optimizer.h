#pragma once
// Per-stage memory optimization with Capuchin's cost model (Peng et al., ASPLOS'20), as DawnPiper
// uses it: make a stage fit the device at the least added time by swapping saved tensors to host
// memory or recomputing them in backward.
//
// Candidates are the stage's saved tensors (CostModel::evictable): graph tensors and the
// autograd-internal buffers the executor holds (dropout masks, matmul operand copies, the loss's
// log-probabilities, max pooling indices), not normalization statistics. A tensor is idle from its last forward use
// until its first backward use; between the two the stage runs the rest of this forward, the passes of other
// micro-batches the schedule puts between a forward and its backward (taken from the simulated action list: the
// shortest such gap), and the backward of later nodes. With swap = bytes / host bandwidth each way, FreeTime = idle -
// swap_out - swap_in.
//   1. (sr) swap tensors with the largest FreeTime > 0 first: fully overlapped, no cost, as long
//      as the host link has room (each direction carries at most one F+B period per micro-batch);
//   2. then repeatedly take the cheapest way to save memory: a swap costing its stall
//      (-FreeTime, plus any link overflow) or a recomputation costing the forward time of the
//      nodes that must re-run (recompute chains: re-running a node needs its inputs, which
//      may have to be rebuilt too; nodes re-run once are shared), ranked by memory saved per
//      millisecond (MSPS). Keys go stale as decisions change; lazy heaps re-evaluate them.
//      The last step takes the cheapest single candidate that covers what is still missing,
//      and a final trim gives back the costliest evictions that turned out unnecessary.
// Saving a tensor removes it from every in-flight micro-batch: in_flight * bytes.
//
// vPipe's block granularity (MemoptGranularity::Block): the unit is a block's internal saved
// tensors (those only read inside the block); block outputs stay as checkpoints, so recomputing
// a block costs its forward time and never chains.
#include <array>
#include <cstdint>
#include <string>
#include <map>
#include <vector>

#include "plan/cost_model.h"
#include "plan/plan.h"

namespace dawnpiper {

enum class MemoptGranularity { Tensor, Block };

struct StageMemopt {
  bool feasible = false;
  double overhead_ms = 0;  // added time per micro-batch (T_x^moo)
  int64_t peak_before = 0;
  int64_t peak = 0;                        // after the decisions (the smallest reachable when infeasible)
  int64_t activation_per_micro_batch = 0;  // saved bytes still kept on the device
  int swapped = 0, recomputed = 0;
  std::vector<TensorDecision> decisions;  // every saved tensor (when asked for), by tensor id
};

// Where each swapped tensor's copy back starts (TensorDecision::prefetch_at) in a stage ending
// before node e: the copies back run one after another on one side stream, so each starts early
// enough to end before the backward that reads it and before the copy queued after it, at the
// host link's speed for its size (CostModel::host_ms).
void place_prefetches(const CostModel& model, int e, std::vector<TensorDecision>& decisions);
// What the backward of that stage waits for the swaps' copies back so queued: the time the first
// of them would have to start before the backward does (it cannot start earlier).
double queued_copy_stall(const CostModel& model, int e, const std::vector<TensorDecision>& decisions);

class MemoryOptimizer {
 public:
  MemoryOptimizer(const CostModel& model, MemoptKind mode, int64_t capacity,
                  MemoptGranularity granularity = MemoptGranularity::Tensor);

  // Stage x holding nodes [b, e). Nothing is evicted when the stage fits as it is.
  StageMemopt optimize(int b, int e, int x, bool with_decisions);

  MemoptKind mode() const { return mode_; }
  MemoptGranularity granularity() const { return granularity_; }
  int64_t capacity() const { return capacity_; }
  void set_capacity(int64_t capacity) { capacity_ = capacity; }

 private:
  // A tensor (block granularity: a block's internal tensors) that could be evicted.
  struct Candidate {
    int tensor;  // -1 for a block unit (members in unit_members_)
    int64_t bytes;
    int last_fwd;        // node of the last forward use in the stage
    int first_bwd;       // node whose backward reads it first (backward runs in reverse)
    bool sent_on;        // also sent to a later stage: in use until the forward's end
    bool recomputable;   // produced in the stage, not data
    double swap_ms = 0;  // one direction
    double free_ms = 0;  // idle - 2 * swap_ms
  };
  // The greedy pass's running state: what is decided, at what cost, what is still missing.
  struct Selection {
    int64_t k = 1;              // in-flight micro-batches: an eviction saves k * bytes
    int64_t need = 0;           // bytes still to save
    std::vector<char> decided;  // per candidate: 0 keep, 1 swap, 2 recompute
    std::vector<double> paid;   // cost when taken
    double link_left = 0;       // host-link time left: one F+B period per micro-batch for the copies out
                                // and back together (one side stream carries both)
    double swap_overhead = 0;   // stalls of the swaps taken
  };
  void gather(int b, int e, int x);
  void add_to_block_unit(std::map<int, int>& unit_of_block, const Candidate& c, int b, int e);
  void time_candidates(int b, int e, int x);
  // What the backward of a stage ending before node e waits for its copies back, queued on one
  // stream in the order they are read (the swaps tensor_state_ holds now).
  double queued_copy_stall(int e) const;
  void greedy(int b, int e, int x, int64_t need, StageMemopt& out);
  // The greedy pass's phases (see the file comment): free swaps, cheapest saving per ms, trim.
  void take_free_swaps(Selection& s);
  void take_cheapest(Selection& s, int b, int e);
  void trim(Selection& s, int b, int e);
  void take_swap(Selection& s, size_t i, double overhead);
  void take_recompute(Selection& s, size_t i, double cost, int b, int e);
  double swap_overhead_of(const Selection& s, size_t i) const;
  // Recompute cost model: marginal cost of evicting candidate i, and committing it.
  double marginal_recompute_ms(int i, int b, int e);
  void commit_recompute(int i, int b, int e);
  bool available_in_backward(int tensor, int b, int e) const;
  // Recomputes the set of re-run nodes and its cost from the current recompute decisions.
  void rebuild_recompute(int b, int e, const std::vector<char>& decided);

  const CostModel& model_;
  MemoptKind mode_;
  int64_t capacity_;
  MemoptGranularity granularity_;

  // What gather() found for stage gathered_ (b, e, x): the same for every capacity. saved_:
  // the tensors the stage's nodes save, ascending.
  std::array<int, 3> gathered_{-1, -1, -1};
  std::vector<int> saved_;
  std::vector<Candidate> candidates_;
  std::vector<size_t> free_order_;  // candidates with free_ms > 0, the most first
  // Epoch-stamped scratch indexed by tensor / node so that each call costs O(stage), not O(n).
  std::vector<int> tensor_epoch_, tensor_state_, node_epoch_, visit_epoch_;
  int epoch_ = 0, visit_ = 0, rerun_ = 0;  // stamps: this call, one DFS, the re-run set
  double recompute_total_ms_ = 0;
  // Block granularity: per unit, its tensors and the block's forward time in the stage.
  std::vector<std::vector<int>> unit_members_;
  std::vector<double> unit_recompute_ms_;
};

}  // namespace dawnpiper
