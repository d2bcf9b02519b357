#pragma once
// CostModel: what a contiguous node range [begin, end) costs as pipeline stage x of l, over a
// Profile. Everything is precomputed (prefix sums, a sparse table, dominance trees) so that the
// time, the activation bytes and the peak memory of any range are O(1) / O(log^2 n) lookups:
// the partition search asks for many ranges.
//
// Per micro-batch activation bytes of a stage = the bytes of the distinct tensors that some node
// of the stage saves for backward (TensorProfile::saved_by meets the range). A tensor produced in
// an earlier stage and saved here counts here. Views own no storage and count nothing;
// autograd-internal buffers count but can never be evicted (TensorProfile::internal).
//
// In-flight micro-batches and weight versions per stage come from simulating the schedule's
// action lists (schedule/simulate.h), the same lists the runtime executes.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "plan/range_query.h"
#include "profile/profile.h"
#include "schedule/schedule.h"
#include "schedule/simulate.h"

namespace dawnpiper {

// Whether node `to` reads what node `from` made, directly or through the nodes between them.
bool feeds(const Profile& profile, int from, int to);

class CostModel {
 public:
  // Throws ConfigError on stages < 1, non-positive
  // bandwidths or a malformed profile (ids out of range).
  CostModel(const Profile& profile, const PlanOptions& options);
  // Under a split backward (zb-h1, zb-h2) a stage holding two readers of one weight, the first
  // feeding the second, cannot run: its W would count the first's gradient twice
  // (split_backward_refusal). Whether nodes [b, e) hold such a pair.
  bool split_refused(int b, int e) const;

  const Profile& profile() const { return *profile_; }
  int size() const { return n_; }
  int stages() const { return stages_; }
  const ScheduleChoice& schedule() const { return schedule_; }
  const StageStats& stage_stats(int x) const { return stats_[static_cast<size_t>(x)]; }
  int in_flight(int x) const { return stage_stats(x).max_in_flight; }
  // Stage x's simulated action list (the runtime's, for simulated_micro_batches()).
  const std::vector<Action>& actions(int x) const { return stage_actions_[static_cast<size_t>(x)]; }
  // Rank r's simulated list: its stages' actions in the order it runs them (one stage per rank
  // unless the schedule interleaves).
  const std::vector<Action>& rank_actions(int r) const { return rank_actions_[static_cast<size_t>(r)]; }
  int ranks() const { return static_cast<int>(rank_actions_.size()); }
  OptimizerKind optimizer() const { return optimizer_; }
  int optimizer_multiplier() const { return optimizer_state_multiplier(optimizer_); }
  // Sharded data parallelism (PlanOptions::sharding()): the level in effect, the replicas and the
  // bucket size; the optimizer state a replica holds for `weights` bytes of parameters (a 1/D
  // shard of it at level 1; the replay counts the shard's padding too).
  int zero_stage() const { return zero_stage_; }
  int data_parallel() const { return data_parallel_; }
  int64_t bucket_bytes() const { return bucket_bytes_; }
  int64_t optimizer_state_bytes(int64_t weights) const {
    return optimizer_multiplier() * (zero_stage_ > 0 ? (weights + data_parallel_ - 1) / data_parallel_ : weights);
  }
  // The gradients a replica holds for `weights` bytes of parameters: all of them, or at level 2
  // its shard (the buckets in flight beside it: the replay).
  int64_t gradient_bytes(int64_t weights) const {
    return zero_stage_ >= 2 ? (weights + data_parallel_ - 1) / data_parallel_ : weights;
  }
  // The parameters a replica holds for `weights` bytes of them: all, or at level 3 its shard and
  // about a bucket gathered (the replay follows each bucket).
  int64_t resident_weight_bytes(int64_t weights) const {
    return zero_stage_ >= 3 ? (weights + data_parallel_ - 1) / data_parallel_ + std::min(weights, bucket_bytes_)
                            : weights;
  }
  int weight_versions(int x) const { return stage_stats(x).max_weight_versions; }

  // --- time (ms, per micro-batch) ---
  double fwd_ms(int b, int e) const { return fwd_[e] - fwd_[b]; }
  double bwd_ms(int b, int e) const { return bwd_[e] - bwd_[b]; }
  // bwd_ms's part a split backward's W takes (NodeProfile::weight_share).
  double weight_ms(int b, int e) const { return weight_[e] - weight_[b]; }
  double compute_ms(int b, int e) const { return fwd_ms(b, e) + bwd_ms(b, e); }
  // One swap copy of `bytes`: at the measured link's speed for that size where there is one.
  double host_ms(int64_t bytes) const {
    return host_link_.measured() ? 1e3 * host_link_.copy_seconds(bytes) : 1e3 * static_cast<double>(bytes) / host_bw_;
  }
  const HostLink& host_link() const { return host_link_; }
  double link_ms(int64_t bytes) const { return 1e3 * static_cast<double>(bytes) / link_bw_; }
  double replica_link_ms(int64_t bytes) const { return 1e3 * static_cast<double>(bytes) / replica_bw_; }
  // Data parallelism: the collectives between a stage's replicas over one update, and their
  // share per micro-batch. A ring moves (D - 1) / D of what it reduces or gathers over the link:
  // levels 0-1 twice the stage's parameter bytes (held_param_bytes: tied copies included) per update (an allreduce, or
  // a reduce-scatter and an all-gather), level 2 a reduce-scatter per micro-batch and an all-gather per update, level 3
  // a gather in each micro-batch's forward and backward and a reduce-scatter.
  double allreduce_ms(int b, int e) const;
  double allreduce_per_micro_batch_ms(int b, int e) const;
  // Where those collectives run in a step, as the runtime starts them (schedule/simulate.h's
  // StageTimes fields of the same names): level 0's allreduce and level 1's reduce-scatter
  // streamed from the step's last weight pass, their last bucket (and level 0's tied weights')
  // after it ends; the buckets of weights tied across stages (levels 1-3) and levels 1-2's
  // all-gather in the update; level 2's reduce-scatter in every weight pass; level 3's gathers in
  // every pass and its reduce-scatter in every weight pass.
  struct Collectives {
    double reduce_ms = 0, reduce_tail_ms = 0, at_update_ms = 0, gather_ms = 0, pass_ms = 0;
  };
  Collectives collectives(int b, int e) const;
  // The optimizer's update of a stage's parameters (tied copies included): their share of the
  // profile's whole-model update (Profile::update_ms), of the replica's 1/D shard at ZeRO levels
  // above 0; once per step, or per micro-batch under async. 0 where the profile has no update
  // times.
  double update_ms(int b, int e) const;
  double update_per_micro_batch_ms(int b, int e) const;
  // The bytes of a stage's parameters tied across its ends (an embedding and the head reading it
  // on another stage): their gradients are summed over the stages before the replicas reduce them.
  int64_t tied_across_bytes(int b, int e) const;
  // Of those, the copies a stage holds of weights another stage owns (an LM head's embedding):
  // parameters of its own, reduced over its replicas and updated as the others.
  int64_t tied_copy_bytes(int b, int e) const;

  // --- memory (bytes) ---
  // The parameters the nodes of [b, e) own (each tied weight counted at its owner).
  int64_t param_bytes(int b, int e) const { return params_[e] - params_[b]; }
  // The parameters a stage over [b, e) holds: its own and its copies of tied weights (each with
  // its gradient and optimizer state, reduced over the replicas).
  int64_t held_param_bytes(int b, int e) const { return param_bytes(b, e) + tied_copy_bytes(b, e); }
  // Constants a stage [b, e) keeps (causal masks, relative-position buckets), each key once.
  int64_t constant_bytes(int b, int e) const;
  // What every stage on the profiled device holds besides the model (Profile::runtime_bytes).
  int64_t runtime_bytes() const { return profile_->runtime_bytes; }
  int64_t activation_bytes(int b, int e) const;  // distinct saved tensors, one micro-batch
  int64_t transient_bytes(int b, int e) const { return transient_.max(b, e); }
  // The most one node of [b, e) holds while its forward runs, one micro-batch, by its own
  // tensors alone: what it reads, what it allocates, its workspace (fewer bytes where a stage
  // boundary would change them: views and copies of received tensors). No eviction removes
  // this, and it only grows with the range.
  int64_t forward_need_bytes(int b, int e) const { return forward_need_.max(b, e); }
  // What stage x over [b, e) holds whatever the memory optimizer decides, a necessary
  // condition for fitting that only grows with the range: parameters with their versions,
  // gradients and optimizer state, the largest workspace, constants (and, with nothing
  // evictable, every activation); at least the weights, optimizer state and constants with the
  // largest forward_need_bytes on top.
  int64_t memory_floor(int b, int e, int x, bool evictable) const;
  // The breakdown for stage x holding `activation_per_micro_batch` saved bytes per micro-batch.
  MemoryBreakdown memory(int b, int e, int x, int64_t activation_per_micro_batch) const;
  int64_t peak_without_memopt(int b, int e, int x) const { return memory(b, e, x, activation_bytes(b, e)).total(); }
  // Peak of stages x0..x1 holding [b, e), if the range were split so that all of them peak
  // equally (exact for one stage; a copy of a tied weight whole on x1, also where the group's own
  // cuts will part it from its owner): the memory-balanced cut of Alg. 1 compares these.
  double balanced_group_peak(int b, int e, int x0, int x1) const;

  // --- communication at a cut (the boundary before node `cut`) ---
  // Non-data tensors produced before the cut and consumed at or after it, ascending ids.
  int crossing_count(int cut) const { return static_cast<int>(cross_count_[cut]); }
  int64_t crossing_bytes(int cut) const { return cross_bytes_[cut]; }
  std::vector<TensorBytes> crossing(int cut) const;
  // Tensors crossing every cut in [lo, hi] (unavoidable there, e.g. an embedding output that
  // every layer reads).
  int spanning_count(int lo, int hi) const;
  int64_t spanning_bytes(int lo, int hi) const;
  void spanning(int lo, int hi, int& count, int64_t& bytes) const;

  // --- graph (derived from the profile's producer / consumer lists) ---
  const std::vector<int>& inputs(int node) const { return inputs_[static_cast<size_t>(node)]; }
  NodeClass node_class(int node) const { return node_classes_[static_cast<size_t>(node)]; }
  // Per tensor: 1 when autograd computes its gradient.
  const std::vector<char>& requires_grad() const { return requires_grad_; }
  const std::vector<int>& saved_by(int tensor) const { return saved_by_[static_cast<size_t>(tensor)]; }
  // Tensors whose saved_by contains `node` (the inverse of saved_by).
  const std::vector<int>& saved_at(int node) const { return saved_at_[static_cast<size_t>(node)]; }
  int last_consumer(int tensor) const { return last_consumer_[static_cast<size_t>(tensor)]; }
  int producer(int tensor) const;
  bool is_data(int tensor) const;
  // Whether the runtime can swap or recompute it: graph tensors, and the autograd-internal
  // buffers the executor keeps a handle on (exposed_internal), not views of parameters. A
  // matmul's operand copy is not made where the operand arrives from an earlier stage.
  bool evictable(int tensor) const { return evictable_[static_cast<size_t>(tensor)] != 0; }
  // A contiguous copy (TensorProfile::copy_of) that a stage starting at node b does not make:
  // its source arrives from an earlier stage, contiguous (not relaid_on_receipt).
  bool copy_not_made(int tensor, int b) const;
  // Whether `tensor` is not contiguous in the whole graph (a transposed view is sent as a
  // contiguous copy: MPI reads one dense buffer).
  bool permuted(int tensor) const;
  // Whether a stage receiving `tensor` lays it out again in the whole graph's dimension order:
  // an imported graph's transposed view, of all of its storage or of a slice of a wider tensor
  // (TensorProfile::relaid_on_receipt, runtime/pipeline_stage.cpp), so that the stage copies and
  // views where the whole graph does (a matmul's operand copy is made). A zoo graph's arrives
  // contiguous.
  bool relaid_on_receipt(int tensor) const;
  int64_t tensor_bytes(int tensor) const { return bytes_[static_cast<size_t>(tensor)]; }
  double recompute_ms(int node) const;
  // Storage sharing, for the replays: the tensors whose alias_of is `tensor`, those that are
  // contiguous copies of it (TensorProfile::copy_of), the owner at the end of its alias chain.
  const std::vector<int>& alias_children(int tensor) const { return alias_children_[static_cast<size_t>(tensor)]; }
  const std::vector<int>& copies_of(int tensor) const { return copies_of_[static_cast<size_t>(tensor)]; }
  int alias_root(int tensor) const { return alias_root_[static_cast<size_t>(tensor)]; }
  const std::vector<int>& alias_roots() const { return alias_root_; }
  const std::vector<int>& data_tensors() const { return data_tensors_; }   // ascending
  const std::vector<char>& owns_storage() const { return owns_storage_; }  // per tensor
  bool is_internal(int tensor) const { return internal_[static_cast<size_t>(tensor)] != 0; }
  // A node's first output that is not an autograd-internal buffer (-1: none), and whether its
  // backward runs (some such output carries a gradient; never for Input nodes).
  int graph_output(int node) const { return graph_output_[static_cast<size_t>(node)]; }
  bool has_backward(int node) const { return has_backward_[static_cast<size_t>(node)] != 0; }

 private:
  // The constructor's parts, in order.
  struct CrossingDiffs {
    std::vector<int64_t> count, bytes;  // per cut 0..n+1: change in what crosses it
  };
  void take_options(const PlanOptions& options);
  void index_nodes();
  CrossingDiffs index_tensors();
  void index_crossings(const CrossingDiffs& diffs);
  void index_aliases();
  void index_gradients();
  void index_split_conflicts();

  const Profile* profile_;
  // Per node: the latest earlier reader of its weight that feeds it under a split backward, -1
  // none (split_refused).
  std::vector<int> split_conflict_;
  int n_ = 0;
  int stages_ = 0;
  ScheduleChoice schedule_ = ScheduleChoice::named("1f1b");
  std::vector<StageStats> stats_;
  std::vector<std::vector<Action>> stage_actions_;  // per stage, in its rank's order
  std::vector<std::vector<Action>> rank_actions_;
  OptimizerKind optimizer_ = OptimizerKind::Sgd;
  std::vector<char> requires_grad_;
  std::vector<NodeClass> node_classes_;
  bool imported_ = false;  // a graph with the export's layouts (imported_kind)
  double host_bw_ = 0, link_bw_ = 0, replica_bw_ = 0;
  HostLink host_link_;  // empty: host_bw_
  int data_parallel_ = 1;
  int zero_stage_ = 0;
  int64_t bucket_bytes_ = 0;
  int64_t micro_batches_ = 1;

  std::vector<double> fwd_, bwd_, weight_;  // prefix sums, size n+1
  std::vector<int64_t> params_;             // prefix sums
  struct TiedWeight {
    int owner = -1;
    std::vector<int> users;  // the nodes reading it, ascending
    int64_t bytes = 0;
  };
  std::vector<TiedWeight> tied_weights_;  // weights other nodes read too
  std::vector<int> constant_nodes_;       // nodes with a stage constant, ascending
  std::vector<int64_t> saved_sum_;        // prefix sums of each node's distinct saved bytes
  DominanceSum saved_repeats_;            // consecutive savers of one tensor, to count it once
  RangeMax transient_;
  RangeMax forward_need_;
  std::vector<int64_t> cross_count_, cross_bytes_;  // per cut 0..n
  std::vector<int64_t> cross_begin_;                // per cut 0..n+1: its slice of cross_tensors_
  std::vector<int> cross_tensors_;
  DominanceSum spanning_;  // (n - producer, n - last consumer) per sent tensor
  std::vector<std::vector<int>> inputs_;
  std::vector<std::vector<int>> saved_by_;  // sorted, distinct
  std::vector<std::vector<int>> saved_at_;
  std::vector<int> last_consumer_;
  std::vector<std::vector<int>> alias_children_, copies_of_;
  std::vector<char> evictable_;
  std::vector<int> alias_root_, data_tensors_;
  // Dense copies of per-tensor / per-node facts the replays read in their inner loops.
  std::vector<int64_t> bytes_;
  std::vector<char> internal_, owns_storage_, has_backward_;
  std::vector<int> graph_output_;
};

}  // namespace dawnpiper
