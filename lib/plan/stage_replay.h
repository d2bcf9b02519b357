#pragma once
// The replay of one stage's action list, allocation by allocation (plan/stage_memory.h): its
// state and its parts. stage_memory.cpp sets it up and runs the actions; stage_replay_walk.cpp
// walks a micro-batch's forward and backward over the nodes; stage_replay_restore.cpp brings
// evicted tensors back (swaps, re-runs); stage_replay_sharding.cpp counts what data parallelism
// adds (level 0's buckets, ZeRO's shards, gathers and buckets in flight) and the update.
// Internal to lib/plan.

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>

#include "plan/stage_memory.h"
#include "graph/op_graph.h"
#include "schedule/interpreter.h"

namespace dawnpiper {

namespace detail {

// One micro-batch's state on the stage between its forward and the end of its backward.
struct MicroBatch {
  std::vector<int> refs;
  std::vector<char> alive, evicted;
  // Gradients: 0 none yet, 1 allocated by this backward (freed once consumed), 2 a received
  // gradient (or a view of one) the stage holds until its backward ends.
  std::vector<char> has_grad;
  std::vector<char> permuted;  // the gradient is a transposed view: reshaping it copies
  // I: the gradient is (a view of) the logits' gradient that the loss wrote over the
  // log-probabilities it saved, which hold it: no bytes of its own.
  std::vector<char> grad_in_loss;
  std::vector<char> grad_views;  // its gradient is a view, summed into out of place (input_gradients)
  // One gradient buffer that several tensors hold: a node that hands its output's gradient
  // itself to its inputs (NodeProfile::passes_gradient: a residual add, a clone) makes them
  // holders of the output's. Per local: the tensor whose bytes stand for its gradient's buffer
  // (-1: a buffer of its own, alone); per such tensor, the holders left (W's holds among them).
  std::vector<int> grad_owner, grad_holders;
  // Per owner: a send of the micro-batch's input gradients holds the buffer too (send_grad); its
  // last other holder then leaves the bytes to the send (send_held_freed, settled after W).
  std::vector<char> grad_sent;
  int64_t send_held_freed = 0;
  int64_t received_grads = 0;          // gradients received for the backward
  int64_t input_grads = 0;             // gradients of received activations, until they are sent back
  int64_t slices_until_input_end = 0;  // I: concats' gradients living until its end (slices held or captured)
  int64_t version = 0;
  std::vector<int> out;  // evictions whose storage is off the device, in program order
  // Split backward: per node offset, the bytes of its outputs' gradients held from I until W
  // (-1: none arrived); whether W is still to come (the state outlives the gradients' send).
  std::vector<int64_t> held_for_weights;
  std::vector<int64_t> wholes_due;  // per node offset: concats' gradients freed after its backward
  bool weights_pending = false;
  bool gradients_sent = false;
  // I: a parameter reader holds (a view of) the logits' gradient in the loss's log-probabilities
  // for W, so they live until W. Else (the readers of a cast or of slices of the logits hold
  // gradients of their own) I's end releases them with the loss's other saved tensors.
  bool loss_grad_held = false;
  bool loss_saved_released = false;  // I: the received logits' gradient took them (released early)
  // The loss's stage: the runtime holds each loss until it reads the step's losses together
  // (after the backward, B or I, that follows the step's last forward): loss_read, they were
  // read since this micro-batch's forward; loss_pending, its graph let the loss go (bytes not
  // yet released: graph_released).
  bool loss_read = false, loss_pending = false;
};

// A program's eviction as the replay tracks it: by storage.
struct Placed {
  int key = -1;       // the storage
  int producer = -1;  // of the evicted tensor
  bool recompute = false;
  int due = -1;             // back from this node's backward on (a swap's prefetch)
  std::vector<int> leaves;  // recompute: storages the re-run reads, held until it ran
};

class StageReplay;
// The sends of a rank's stages replayed together, oldest first: the rank's transport completes
// the oldest beyond `depth` (ScheduleTraits::sends_in_flight) whichever stage made it.
struct RankSends {
  size_t depth = 1;
  std::deque<StageReplay*> order;
};

class StageReplay final : public ActionHooks {
 public:
  // Stage x over [b, e) running `actions`: what does not depend on the evictions is set up here.
  StageReplay(const CostModel& model, int b, int e, int x, const std::vector<Action>& actions,
              std::vector<Action>* events, std::vector<int64_t>* event_live = nullptr);
  // The evictions carrying out `decisions`, placed as stage_program() places them.
  std::vector<Eviction> place(const std::vector<TensorDecision>& decisions) const {
    return dawnpiper::place_evictions(model_, b_, e_, decisions, is_received_);
  }
  // Walks the actions with these evictions (any number of times, one set each).
  StageMemoryReplay run(const std::vector<Eviction>& evictions);
  // One of several stages on a rank (replay_rank_peak): begin, then one step per action of the
  // stage, each walked in full, its highs over `others_live` (the rank's other stages' bytes)
  // noted in *rank_peak.
  void begin(const std::vector<Eviction>& evictions, int64_t* rank_peak, RankSends* rank_sends);
  void step(const Action& a, int index, int64_t others_live);
  int64_t live() const { return live_; }
  void complete_oldest_send();
  void settle_sent_gradients(int64_t mb, MicroBatch& m);

 private:
  size_t at(int t) const { return static_cast<size_t>(t); }
  // A micro-batch's state is indexed by the stage's own numbering of the tensors it touches.
  size_t loc(int t) const { return static_cast<size_t>(local_[at(t)]); }
  int64_t bytes(int t) const { return model_.tensor_bytes(t); }
  bool in_range(int node) const { return node >= b_ && node < e_; }
  bool allocates(int t) const { return storage_[at(t)] && key_[at(t)] == t; }
  // The storages a saver of tensor t holds (a received view's own copy, else t's storage).
  template <class F>
  void for_saver_keys(int t, F f) const;
  void place_storages();
  void find_in_place_gradients();
  void find_sliced_gradients();
  void find_concat_wholes();
  // Where node c's (a concat's) whole gradient goes, in place of the rule at node i.
  bool whole_goes_later(MicroBatch& m, int c, int i, bool input_only, int64_t whole);
  void number_locals();
  void count_references();
  void place_weights();
  void place_evictions();
  void measure_messages();

  void note(int64_t value, int node);
  void emit(ActionKind kind, int64_t mb, int tensor);
  MicroBatch& state(int64_t mb);
  void retire(int64_t mb);  // its backward is done: the state's buffers are kept for the next
  void release(MicroBatch& m, int k);
  void evict(MicroBatch& m, int64_t mb, int index);
  void restore_for(MicroBatch& m, int64_t mb, int node, size_t& next_due);
  bool collect_due(const MicroBatch& m, int node, size_t& next_due);
  void swap_in_due(MicroBatch& m, int64_t mb, int node, size_t first_due, size_t next_due);
  // Copies back in the order the evictor starts them: those read first first, ties in program
  // order (runtime/evictor.cpp, plan/memory_optimizer.h's place_prefetches).
  void sort_copies_back(std::vector<int>& evictions) const;
  void restore_with_rerun(MicroBatch& m, int64_t mb, int node);
  void note_rerun(int node);
  void send(int64_t held_by_send, int64_t originals_of, int64_t gradients_of = std::numeric_limits<int64_t>::min());
  void reset_walk();
  // The list's actions (schedule/interpreter.h).
  void forward(const Action& a) override;
  void backward(const Action& a) override { backward_action(a.micro_batch); }
  void backward_input(const Action& a) override;
  void backward_weight(const Action& a) override;
  void recv_activation(const Action& a) override;
  void send_activation(const Action& a) override { send_activations(a.micro_batch); }
  void recv_grad(const Action& a) override { receive_gradients(a.micro_batch); }
  void send_grad(const Action& a) override;
  void optimizer_step(const Action&) override { optimizer_step(); }
  void reduce_tied_grads(const Action&) override {}  // its sums are the stage's transients (tied_sum_at_)
  void runtime_action(const Action&) override {}     // the replay places its own evictions
  void send_activations(int64_t mb);
  void receive_gradients(int64_t mb);
  void backward_action(int64_t mb);
  void graph_released(int64_t mb, MicroBatch& m);
  void read_losses();

  // Every micro-batch's forward starts from the same state (what it received), and so does
  // every backward but the first of a step (which creates the parameters' gradients): without
  // events to record, each is walked once and repeated for the other micro-batches.
  struct Walk {
    bool done = false, noted = false;
    int64_t delta = 0, param_grads = 0;
    int64_t high = 0;             // the highest point noted, above the start (the first of equals)
    int node = -1;                // ... and where
    std::vector<char> grad_done;  // backward: which parameters have their gradient after it
    std::vector<char> gathered;   // level 3: which buckets are gathered after it
    MicroBatch after;
  };
  template <class Body>
  void walk_once(Walk& w, MicroBatch& m, bool backward, Body body);
  void forward(int64_t mb, MicroBatch& m);
  void forward_nodes(int64_t mb, MicroBatch& m);
  void backward(int64_t mb, MicroBatch& m);
  // input_only: I, which keeps what the forward saved and the parameter-reading nodes' output
  // gradients, and makes no parameter gradient.
  void backward_nodes(int64_t mb, MicroBatch& m, bool input_only = false);
  void backward_node(MicroBatch& m, int i, bool input_only = false);
  // A concat's gradient read in slices (has_grad 3) at node i: its transient copies, and what I
  // holds of it for W (slices_held: the whole; slice_copy: a copy of the node's slice).
  void concat_slice_gradient(MicroBatch& m, int i, bool input_only, int64_t& transient, int64_t& slices_held,
                             int64_t& slice_copy, int64_t& freed_after);
  void loss_gradient_in_input_pass(MicroBatch& m, const NodeProfile& node, int64_t reused);
  void param_gradient(int i, int64_t& grads, int64_t& transient);
  // Tensor t's gradient let go: the bytes its buffer frees (none while another holder has it).
  int64_t gradient_released(MicroBatch& m, int t);
  bool gradient_shared(const MicroBatch& m, int t) const {
    const int owner = m.grad_owner[loc(t)];
    return owner >= 0 && m.grad_holders[loc(owner)] > 1;
  }
  void weight_nodes(int64_t mb, MicroBatch& m);
  void release_graph(MicroBatch& m);  // what the forward saved, the sent tensors, the loss
  void backward_slices(MicroBatch& m, int i, bool input_only);
  bool held_slices_cover(int concat) const;
  struct InputGradients {
    int64_t grads = 0, transient = 0;  // allocated for the inputs; held while the node runs
    bool passed_on = false;            // a view hands its output's gradient to its input
    bool copied_view = false;          // ... unless it must copy it first
  };
  InputGradients input_gradients(MicroBatch& m, int i, bool view, bool input_only);
  static int64_t backward_workspace(const NodeProfile& node, bool input_only);
  void find_loss();
  int64_t overwritten_logits(const MicroBatch& m, int n) const;
  void optimizer_step();

  const CostModel& model_;
  const Profile& p_;
  const std::vector<Action>& actions_;
  const std::vector<Eviction>* evictions_ = nullptr;  // of the current run
  std::vector<Action>* events_;
  std::vector<int64_t>* event_live_;  // live bytes at each event, when given
  const int b_, e_, x_, T_;
  const bool stashes_, stream_;  // weight versions kept; one list for the run (no step repeats)
  const bool last_;
  const std::vector<char>& requires_grad_;

  // Storages: a received activation is a fresh copy; anything else lives in the storage of its
  // alias chain's owner (key_). Views of parameters allocate nothing.
  std::vector<TensorBytes> received_, sent_;
  std::vector<char> is_received_, storage_;
  std::vector<int> key_;
  std::map<int, std::vector<int>> received_of_owner_;  // received views of a sender-side owner
  std::vector<int> local_;                             // per tensor: its local number, -1 untouched
  int locals_ = 0;
  std::vector<int> base_refs_, refs_;  // forward references of each storage: the stage's, with the evictions
  std::vector<int> data_, data_read_later_;
  int loss_ = -1;

  int64_t weights_ = 0;
  std::vector<int64_t> grad_at_, hold_from_, hold_to_;  // per node offset
  std::vector<char> in_place_grad_;                     // per node offset: NodeClass::InPlaceGradient applies
  std::vector<char> reads_params_;                      // per node offset: the weight pass starts there
  std::vector<char> weight_only_;  // per node offset: reads parameters and no tracked input (I skips it)
  // Per node offset (find_sliced_gradients): slices_gradient_, a concat whose backward hands
  // each input a slice of one gradient (1, 2: see there); frees_slices_of_, the concat whose
  // gradient the node's backward (its first input's producer, the last to run) frees, -1 none.
  std::vector<char> slices_gradient_;
  std::vector<int> frees_slices_of_;
  // Per node offset (find_concat_wholes): for a concat, whether I may hold a slice of its
  // gradient for W (the whole then lives until I ends), and the node after whose backward the
  // whole goes otherwise (-1: the rules of find_sliced_gradients alone).
  std::vector<char> whole_held_in_input_;
  std::vector<int> whole_freed_after_;
  // The stage's loss node where it may write over fp32 logits (find_loss), else -1; the
  // logits, and the bytes overwriting them saves.
  int loss_node_ = -1, loss_logits_ = -1;
  int64_t loss_saving_ = 0;
  // The runtime reads the step's losses once it holds this many (the stage's forwards in a
  // step: its list's, one step; an asynchronous list's all, an overestimate); those it holds,
  // and their bytes whose graphs let them go.
  int64_t losses_per_read_ = 0, losses_held_ = 0, held_loss_bytes_ = 0;
  // A tied weight's later users in the backward (an LM head's chunks): each makes a whole
  // weight's gradient (a slice's backward fills zeros around its rows) before it is summed in.
  std::vector<int64_t> tied_sum_at_;

  std::vector<Placed> placed_;                      // the program's evictions, in its order
  std::vector<std::vector<int>> evict_after_;       // node offset -> evictions
  std::vector<int> evict_after_send_, by_restore_;  // by_restore_: by due node, latest first
  std::vector<int> due_scratch_, rerun_scratch_, chain_scratch_;
  bool repeat_walks_ = false;
  Walk forward_walk_, backward_walk_[2];  // backward: the step's first, the later ones
  Walk input_walk_, weight_walk_[2];      // split backward: I, and W as backward
  Walk* recording_ = nullptr;
  int64_t walk_start_ = 0;
  bool backward_in_step_ = false;
  // Deriving the second pass of a synchronous step: the first pass's highest points (the first
  // of equals) before its first send and from there up to the optimizer step. segment_: -1 not
  // tracked, 0 before the first send, 1 up to the step, 2 from the step on.
  struct Mark {
    int64_t value = std::numeric_limits<int64_t>::min();
    int action = -1, node = -1;
  };
  Mark before_send_, before_step_;
  int segment_ = -1;
  bool shared_keys_ = false;  // two evictions of one storage (m.out holds the first evicted)

  int64_t received_bytes_ = 0, sent_bytes_ = 0, received_grad_bytes_ = 0, permuted_sent_bytes_ = 0;
  // The runtime gives a received gradient its tensor's layout, one copy at a time.
  int64_t largest_permuted_grad_ = 0;
  std::vector<int> relaid_grads_;  // the sent tensors whose gradients get that copy, ascending
  // Received tensors that are permuted views of all their storage get that layout back, one
  // copy at a time; their gradients keep it, so the transport sends contiguous copies of them
  // (all at once, beside them).
  int64_t largest_relaid_input_ = 0, relaid_input_grad_bytes_ = 0;
  std::vector<int> sent_originals_;  // storages of the sent tensors sent as they are (not copies), distinct

  // The walk's state.
  StageMemoryReplay r_;
  int64_t live_ = 0;
  int current_action_ = -1;
  std::map<int64_t, MicroBatch> mbs_;
  std::vector<MicroBatch> spare_;
  // Sends the transport has not completed, oldest first: the bytes only it still references, and
  // the micro-batch whose activations it sent as they are (sent_originals_), else INT64_MIN.
  struct PendingSend {
    int64_t bytes = 0;
    int64_t originals_of = std::numeric_limits<int64_t>::min();
    int64_t gradients_of = std::numeric_limits<int64_t>::min();  // the micro-batch whose input gradients
  };
  std::deque<PendingSend> pending_sends_;
  int64_t pending_send_bytes() const {
    int64_t total = 0;
    for (const PendingSend& p : pending_sends_) total += p.bytes;
    return total;
  }
  int64_t param_grads_ = 0;
  std::vector<char> grad_done_;
  bool optimizer_state_ = false;
  // ZeRO level 1 (runtime/zero_shard.h): the buckets' bytes with their padding, in order (of
  // whole nodes' parameters: the runtime closes a bucket at a parameter), and the replica's shard.
  std::vector<int64_t> zero_buckets_;
  int64_t zero_shard_ = 0;
  int64_t optimizer_state_bytes() const {
    return model_.zero_stage() > 0 ? model_.optimizer_multiplier() * zero_shard_
                                   : model_.optimizer_state_bytes(weights_);
  }
  // Buckets as the runtime cuts them (cut_buckets): per node offset its bucket (-1: none), per
  // bucket its parameters' bytes and whether it holds a weight tied across stages.
  struct BucketCut {
    std::vector<int> bucket_of;
    std::vector<int64_t> bytes;
    std::vector<char> tied;
  };
  BucketCut cut_buckets(const std::vector<int64_t>& param_bytes) const;
  void place_zero_buckets(const std::vector<int64_t>& param_bytes);
  // tied_users: per tied weight's owner, its users in the stage, last first.
  void place_gather_reads(const std::map<int, std::vector<int>>& tied_users);
  // Level 2: each micro-batch's gradients are reduce-scattered a bucket at a time as the
  // backward makes them (the last bucket first, each once its nodes have made theirs and the
  // buckets before it started; two in flight), into the shard, whose chunk of a bucket is held
  // from the bucket's first start in a step to the update. Buckets of weights tied across stages
  // wait for the update. Per node offset its bucket (-1: no parameter), per bucket its
  // gradients' bytes, whether it waits, its nodes still to make theirs in this micro-batch and
  // whether its chunk is held. Level 1 streams so only in the step's last weight pass (over
  // the gradients the step summed), and its last two buckets travel on until the update.
  bool zero_streams() const { return model_.zero_stage() >= 2; }
  bool zero_streaming() const { return zero_streams() || zero_armed_; }
  // Level 0 with replicas on MPI (runtime/replica_averager.h): the step's last weight pass packs
  // each bucket's gradients into a buffer of their bytes (the last bucket first, each once its
  // nodes have made theirs in the pass and the buckets before it are packed), the buffer beside
  // the gradients until they go; the buckets of weights tied across stages, and the rest, when
  // the pass ends (B: once it let its graph go; W: before); the averaged buffers are
  // the gradients until the update, which packs what no pass did (async). (A split backward's
  // first W of a run, which the runtime needs to count each parameter's accumulations, packs
  // everything at its end: with one micro-batch a step, step 0 differs from this steady state.)
  bool averages_buckets() const {
    return model_.zero_stage() == 0 && model_.data_parallel() > 1 && model_.bucket_bytes() > 0;
  }
  void place_average_buckets(const std::vector<int64_t>& param_bytes);
  bool begin_weight_pass();  // whether it is the step's last, packing (level 0) or streaming (1) as it goes
  void average_gradient_made(int i);
  void average_pack(size_t bucket);
  void average_pass_end();
  std::vector<int64_t> avg_buckets_;
  std::vector<int> avg_bucket_of_, avg_waiting_;
  std::vector<char> avg_deferred_, avg_packed_;
  std::vector<size_t> avg_order_;
  size_t avg_next_ = 0;
  int64_t weight_passes_per_step_ = 0, weight_passes_ = 0;  // (counted where the last packs or streams)
  bool avg_armed_ = false, zero_armed_ = false;
  bool zero_streamed(int i) const {
    const int k = zero_bucket_of_.empty() ? -1 : zero_bucket_of_[at(i - b_)];
    return zero_streams() && (k < 0 || !zero_deferred_[at(k)]);
  }
  void zero_gradient_made(int i);
  void zero_start(size_t bucket);
  void zero_end_micro_batch();
  std::vector<int> zero_bucket_of_, zero_waiting_;
  std::vector<int64_t> zero_bucket_grads_;
  std::vector<char> zero_deferred_, zero_made_, zero_chunk_held_;
  std::vector<size_t> zero_order_;  // the streamed buckets, in the order they start
  size_t zero_next_ = 0;
  std::deque<int64_t> zero_travelling_;
  // Level 3 (runtime/zero_shard.h): the replica holds its shard of the parameters; a bucket's
  // parameters are gathered into one storage of its padded size where a node reads one, in the
  // forward let go after the last of a run of readers, in the backward once its nodes have made
  // their gradients (the rest at the micro-batch's end). Per node
  // offset the buckets it reads and the next node reading any; per bucket whether it is
  // gathered and its nodes still to make their gradients. The forward gathers one reader ahead
  // (ZeroShard::before_forward_node): a node reading parameters of its own (param_reads_, not
  // through a view) gathers the next such node's buckets too, kept until that node has run; the
  // backward likewise (ZeroShard::before_backward_node): a node gathering anything gathers the
  // previous such node's buckets, held as any gathered in the backward. A split backward's input
  // pass (ZeroShard::inputs_gradient_made) lets a bucket go where every node that gathered it in
  // the pass has run: where the gradient of one of the node's inputs made here is complete (at
  // that input's producer), unless the bucket was gathered ahead for the next reader.
  bool zero_gathers() const { return model_.zero_stage() >= 3; }
  void gather_read(int i);
  void gather_buckets(const std::vector<int>& buckets, int node);
  void gather_forward(int i);
  void gather_backward(int i, bool input_only);
  void input_pass_begins();
  void readers_ran(int i);  // input pass: node i's output gradient is complete
  void after_forward_node(int i);
  void gather_released(int i);  // node i made its gradients
  void sent_views_copied();     // the send copied the sent views of parameters: their buckets go
  void release_gathered();
  std::vector<std::vector<int>> gather_reads_;
  std::vector<std::vector<int>> param_reads_;
  std::vector<int> next_reader_, next_param_reader_, previous_param_reader_, gather_unmade_;
  std::vector<std::vector<int>> readers_of_output_;  // per node offset: the gathering nodes reading its outputs
  std::vector<char> input_pass_node_;                // per node offset: 0 not gathered, 1 gathered, 2 ran
  std::vector<int> input_pass_readers_;              // per bucket: nodes gathered in the pass, not yet run
  int ahead_reader_ = -1;
  std::vector<char> gathered_;
  // A sent view of parameters (a transposed weight the next stage reads) keeps its buckets from
  // its producer (per bucket; INT_MAX: none) until the send, which sends it as a copy (the
  // contiguous ones too: sent_param_view_copies_, beside the permuted ones), then they go.
  std::vector<int> sent_view_from_;
  std::vector<int> sent_param_views_;  // the sent tensors that view parameters
  int64_t sent_param_view_copies_ = 0;
  int64_t version_ = 0;
  std::map<int64_t, int> version_users_;
  int64_t* rank_peak_ = nullptr;     // a rank's stages replayed together: their peak
  int64_t others_live_ = 0;          // ... and what the other stages hold now
  RankSends* rank_sends_ = nullptr;  // ... and their sends not yet completed
  RankSends own_sends_;              // alone: its own
  RankSends& sends() { return rank_sends_ ? *rank_sends_ : own_sends_; }
};

template <class F>
void StageReplay::for_saver_keys(int t, F f) const {
  if (!received_of_owner_.empty()) {
    auto found = received_of_owner_.find(t);
    if (found != received_of_owner_.end()) {
      for (int k : found->second) f(k);
      return;
    }
  }
  f(key_[at(t)]);
}

template <class Body>
void StageReplay::walk_once(Walk& w, MicroBatch& m, bool backward, Body body) {
  if (!repeat_walks_) return body();
  if (w.done) {
    if (w.noted) note(live_ + w.high, w.node);
    live_ += w.delta;
    param_grads_ += w.param_grads;
    if (backward) grad_done_ = w.grad_done;
    gathered_ = w.gathered;
    const int64_t version = m.version;
    const bool loss_read = m.loss_read;
    m = w.after;
    m.version = version, m.loss_read = loss_read;
    return;
  }
  recording_ = &w;
  walk_start_ = live_;
  const int64_t grads = param_grads_;
  body();
  recording_ = nullptr;
  w.delta = live_ - walk_start_;
  w.param_grads = param_grads_ - grads;
  if (backward) w.grad_done = grad_done_;
  w.gathered = gathered_;
  w.after = m;
  w.done = true;
}

}  // namespace detail

}  // namespace dawnpiper
