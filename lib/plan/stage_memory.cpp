#include "plan/stage_memory.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>

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
  int64_t received_grads = 0;  // gradients received for the backward
  int64_t input_grads = 0;     // gradients of received activations, until they are sent back
  int64_t version = 0;
  std::vector<int> out;  // evictions whose storage is off the device, in program order
  // Split backward: per node offset, the bytes of its outputs' gradients held from I until W
  // (-1: none arrived); whether W is still to come (the state outlives the gradients' send).
  std::vector<int64_t> held_for_weights;
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

int64_t sum_bytes(const std::vector<TensorBytes>& list) {
  int64_t s = 0;
  for (const TensorBytes& t : list) s += t.bytes;
  return s;
}

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
  void send(int64_t held_by_send, int64_t originals_of);
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
  void param_gradient(int i, int64_t& grads, int64_t& transient);
  void weight_nodes(int64_t mb, MicroBatch& m);
  void release_graph(MicroBatch& m);  // what the forward saved, the sent tensors, the loss
  void backward_slices(MicroBatch& m, int i);
  struct InputGradients {
    int64_t grads = 0, transient = 0;  // allocated for the inputs; held while the node runs
    bool passed_on = false;            // a view hands its output's gradient to its input
    bool copied_view = false;          // ... unless it must copy it first
  };
  InputGradients input_gradients(MicroBatch& m, int i, bool view, bool input_only);
  static int64_t backward_workspace(const NodeProfile& node);
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
  std::vector<int> relaid_grads_;    // the sent tensors whose gradients get that copy, ascending
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
  void place_zero_buckets(std::vector<int64_t> param_bytes);
  // Level 2: each micro-batch's gradients are reduce-scattered a bucket at a time as the
  // backward makes them (the last bucket first, each once its nodes have made theirs and the
  // buckets before it started; two in flight), into the shard, whose chunk of a bucket is held
  // from the bucket's first start in a step to the update. Buckets of weights tied across stages
  // wait for the update. Per node offset its bucket (-1: no parameter), per bucket its
  // gradients' bytes, whether it waits, its nodes still to make theirs in this micro-batch and
  // whether its chunk is held.
  bool zero_streams() const { return model_.zero_stage() >= 2; }
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
  bool begin_weight_pass();  // whether it is the step's last, packing as it goes
  void average_gradient_made(int i);
  void average_pack(size_t bucket);
  void average_pass_end();
  std::vector<int64_t> avg_buckets_;
  std::vector<int> avg_bucket_of_, avg_waiting_;
  std::vector<char> avg_deferred_, avg_packed_;
  std::vector<size_t> avg_order_;
  size_t avg_next_ = 0;
  int64_t avg_passes_per_step_ = 0, avg_passes_ = 0;
  bool avg_armed_ = false;
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
  // gathered and its nodes still to make their gradients.
  bool zero_gathers() const { return model_.zero_stage() >= 3; }
  void gather_read(int i);
  void after_forward_node(int i);
  void gather_released(int i);  // node i made its gradients
  void release_gathered();
  std::vector<std::vector<int>> gather_reads_;
  std::vector<int> next_reader_, gather_unmade_;
  std::vector<char> gathered_;
  int64_t version_ = 0;
  std::map<int64_t, int> version_users_;
  int64_t* rank_peak_ = nullptr;     // a rank's stages replayed together: their peak
  int64_t others_live_ = 0;          // ... and what the other stages hold now
  RankSends* rank_sends_ = nullptr;  // ... and their sends not yet completed
  RankSends own_sends_;              // alone: its own
  RankSends& sends() { return rank_sends_ ? *rank_sends_ : own_sends_; }
};

StageReplay::StageReplay(const CostModel& model, int b, int e, int x, const std::vector<Action>& actions,
                         std::vector<Action>* events, std::vector<int64_t>* event_live)
    : model_(model),
      p_(model.profile()),
      actions_(actions),
      events_(events),
      event_live_(event_live),
      b_(b),
      e_(e),
      x_(x),
      T_(static_cast<int>(model.profile().tensors.size())),
      stashes_(model.schedule().traits().stashes_weights),
      stream_(!model.schedule().traits().drains_every_step),
      last_(e == model.size()),
      requires_grad_(model.requires_grad()) {
  own_sends_.depth = static_cast<size_t>(model.schedule().traits().sends_in_flight);
  if (last_)
    for (const Action& a : actions_) losses_per_read_ += a.kind == ActionKind::Forward;
  place_storages();
  find_in_place_gradients();
  find_sliced_gradients();
  find_loss();
  number_locals();
  count_references();
  place_weights();
  measure_messages();
}

void StageReplay::place_storages() {
  if (b_ > 0) received_ = model_.crossing(b_);
  if (e_ < model_.size()) sent_ = model_.crossing(e_);
  is_received_.assign(at(T_), 0);
  for (const TensorBytes& r : received_) is_received_[at(r.tensor)] = 1;
  // From the graph's owners, patched where a received tensor (a fresh copy) starts a storage of
  // its own: its views share it, and the copy the whole graph makes of it is not made.
  key_ = model_.alias_roots();
  storage_ = model_.owns_storage();
  std::vector<int> stack;
  for (const TensorBytes& r : received_) {
    storage_[at(r.tensor)] = 1;
    stack.assign(1, r.tensor);
    while (!stack.empty()) {
      const int t = stack.back();
      stack.pop_back();
      key_[at(t)] = r.tensor;
      for (int v : model_.alias_children(t))
        if (!is_received_[at(v)]) stack.push_back(v);
    }
  }
  for (const TensorBytes& r : received_)
    for (int c : model_.copies_of(r.tensor)) storage_[at(c)] = 0;
  // Received views: the stage's savers of the sender-side owner save the received copy.
  for (const TensorBytes& r : received_) {
    const int o = model_.alias_root(r.tensor);
    if (o != r.tensor && !is_received_[at(o)]) received_of_owner_[o].push_back(r.tensor);
  }
}

// A node that writes its input's gradient over its output's (exec/lean_ops.cpp: fp32 only).
// Not counted where a view node of the stage reads its output: the gradient handed back is then
// a view, which the executor overwrites only when nothing else holds its base (an
// overestimate, never an underestimate). A gradient the stage received is held by the stage:
// has_grad 2, checked in backward_node.
void StageReplay::find_in_place_gradients() {
  in_place_grad_.assign(static_cast<size_t>(e_ - b_), 0);
  if (p_.precision != Precision::Fp32) return;
  for (int i = b_; i < e_; ++i) in_place_grad_[at(i - b_)] = model_.node_class(i) == NodeClass::InPlaceGradient;
  for (int j = b_; j < e_; ++j) {
    const int out = model_.graph_output(j);
    if (out < 0 || model_.owns_storage()[at(out)]) continue;
    for (int t : model_.inputs(j)) {
      const int producer = p_.tensors[at(t)].producer;
      if (producer >= b_ && producer < e_) in_place_grad_[at(producer - b_)] = 0;
    }
  }
}

// at::cat's backward hands each input a slice of its output's gradient: no new storage, and the
// whole gradient lives until the last slice is consumed. A slice is not contiguous unless it is
// cut along the first dimension: a linear's or a convolution's backward copies it, and so does
// the gradient of a received input (autograd gives a leaf a gradient of its own layout); the
// copy is counted as a transient of the node reading it. Counted so for concats whose inputs are
// each read by the concat alone and made by a node of the stage (an LM head's chunks: the zoo's
// --output-chunks, an export's; AmoebaNet's cell outputs) or received; other concats keep the
// rule of a node allocating its inputs' gradients. slices_gradient_: 1, freed after the backward
// of the first input's producer (the last to run); 2, all received: freed once their copies are
// made.
void StageReplay::find_sliced_gradients() {
  slices_gradient_.assign(static_cast<size_t>(e_ - b_), 0);
  frees_slices_of_.assign(static_cast<size_t>(e_ - b_), -1);
  for (int i = b_; i < e_; ++i) {
    if (model_.node_class(i) != NodeClass::Concat || model_.inputs(i).size() < 2) continue;
    int first = e_;
    bool slices = true;
    int64_t input_bytes = 0;
    for (int t : model_.inputs(i)) {
      const TensorProfile& tp = p_.tensors[at(t)];
      // Made by a node whose backward reads t's gradient as its own output's (not another output).
      const bool made_here = tp.producer >= b_ && tp.producer < i && model_.owns_storage()[at(t)] &&
                             model_.graph_output(tp.producer) == t && model_.has_backward(tp.producer);
      slices = slices && (made_here || is_received_[at(t)]) && tp.consumers.size() == 1 && requires_grad_[at(t)];
      if (made_here) first = std::min(first, tp.producer);
      input_bytes += bytes(t);
    }
    // Inputs are listed once: a tensor concatenated twice gets the sum of two slices, a buffer
    // of its own (the general rule). Its output is then larger than its inputs.
    if (!slices || input_bytes != bytes(model_.graph_output(i))) continue;
    slices_gradient_[at(i - b_)] = first < e_ ? 1 : 2;
    if (first < e_) frees_slices_of_[at(first - b_)] = i;
  }
}

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

// Numbers every tensor (and storage) the stage's walk may look at: what its nodes read, make and
// save, what it receives and sends, the data, the loss, what its evictions move and read.
void StageReplay::number_locals() {
  local_.assign(at(T_), -1);
  auto add = [&](int t) {
    for (int u : {t, key_[at(t)]})
      if (local_[at(u)] < 0) local_[at(u)] = locals_++;
  };
  for (int n = b_; n < e_; ++n) {
    for (int t : model_.inputs(n)) add(t);
    for (int t : p_.nodes[at(n)].outputs) add(t);
    for (int t : p_.nodes[at(n)].saved) {
      add(t);
      for_saver_keys(t, add);
    }
  }
  for (const TensorBytes& r : received_) add(r.tensor);
  for (const TensorBytes& s : sent_) add(s.tensor);
  for (int t : model_.data_tensors()) add(t);
  if (last_) add(p_.nodes.back().outputs[0]);
  // An eviction's tensor is one of these (place_evictions refuses others), and what a re-run
  // reads is an input of a stage node.
}

// Forward references of each storage: readers in the range, savers in the range, the sent
// tensors (until backward), the received ones (until their gradients are sent), data read later
// (until the forward ends) and the loss (read by the backward).
void StageReplay::count_references() {
  base_refs_.assign(static_cast<size_t>(locals_), 0);
  for (int n = b_; n < e_; ++n)
    for (int t : model_.inputs(n)) ++base_refs_[loc(key_[at(t)])];
  for (int n = b_; n < e_; ++n)
    for (int t : p_.nodes[at(n)].saved) for_saver_keys(t, [&](int k) { ++base_refs_[loc(k)]; });
  for (const TensorBytes& s : sent_) ++base_refs_[loc(key_[at(s.tensor)])];
  for (const TensorBytes& r : received_) ++base_refs_[loc(r.tensor)];
  for (int id : model_.data_tensors()) {
    const TensorProfile& t = p_.tensors[at(id)];
    bool read_here = false, read_later = false;
    for (int c : t.consumers) read_here |= in_range(c), read_later |= c >= e_;
    if (!read_here) continue;
    data_.push_back(t.id);
    if (read_later) data_read_later_.push_back(t.id), ++base_refs_[loc(t.id)];
  }
  if (last_) loss_ = p_.nodes.back().outputs[0], ++base_refs_[loc(loss_)];
}

// Parameters held, and where in the backward each one's gradient appears.
void StageReplay::place_weights() {
  const size_t n_nodes = static_cast<size_t>(e_ - b_);
  grad_at_.assign(n_nodes, 0);
  tied_sum_at_.assign(n_nodes, 0);
  reads_params_.assign(n_nodes, 0);
  weight_only_.assign(n_nodes, 0);
  for (int n = b_; n < e_; ++n) {
    reads_params_[at(n - b_)] = p_.nodes[at(n)].param_bytes > 0 || p_.nodes[at(n)].tied_owner >= 0;
    bool tracked_input = false;
    for (int t : model_.inputs(n)) tracked_input = tracked_input || requires_grad_[at(t)];
    weight_only_[at(n - b_)] = reads_params_[at(n - b_)] && !tracked_input;
  }
  std::set<int> tied_outside;
  std::map<int, std::vector<int>> tied_users;  // owner -> users in the stage, last first
  std::vector<int64_t> held_bytes;             // per node, last first: what it adds to the weights
  for (int n = e_ - 1; n >= b_; --n) {
    const NodeProfile& node = p_.nodes[at(n)];
    held_bytes.push_back(node.param_bytes);
    weights_ += node.param_bytes;
    grad_at_[at(n - b_)] += node.param_bytes;
    if (node.tied_owner < 0) continue;
    std::vector<int>& users = tied_users[node.tied_owner];
    users.push_back(n);
    if (users.size() > 1) {  // an LM head's chunks: one weight, one gradient, summed into
      tied_sum_at_[at(n - b_)] += node.tied_bytes;
      continue;
    }
    if (in_range(node.tied_owner)) {  // one gradient, first created by the latest user
      grad_at_[at(n - b_)] += node.tied_bytes;
      grad_at_[at(node.tied_owner - b_)] -= node.tied_bytes;
    } else if (tied_outside.insert(node.tied_owner).second) {  // a copy held here
      weights_ += node.tied_bytes;
      held_bytes.back() += node.tied_bytes;
      grad_at_[at(n - b_)] += node.tied_bytes;
    }
  }
  std::reverse(held_bytes.begin(), held_bytes.end());
  place_average_buckets(held_bytes);
  place_zero_buckets(std::move(held_bytes));
  if (zero_gathers()) {
    // What each node reads: its own parameters, and a tied weight's owner or the copy here (held
    // by its last user in the stage).
    gather_reads_.assign(n_nodes, {});
    next_reader_.assign(n_nodes, -1);
    // A view a parameter reader makes (a position embedding's slice, a transposed weight) and
    // views of it keep the buckets until their readers have run (the runtime looks at what
    // the forward still holds).
    std::map<int, std::vector<int>> views;  // tensor -> the buckets it views
    for (int n = b_; n < e_; ++n) {
      std::vector<int>& reads = gather_reads_[at(n - b_)];
      if (zero_bucket_of_[at(n - b_)] >= 0) reads.push_back(zero_bucket_of_[at(n - b_)]);
      const int owner = p_.nodes[at(n)].tied_owner;
      if (owner >= 0) {
        const int holder = in_range(owner) ? owner : tied_users.at(owner).front();
        if (zero_bucket_of_[at(holder - b_)] >= 0) reads.push_back(zero_bucket_of_[at(holder - b_)]);
      }
      for (int t : model_.inputs(n))
        if (auto v = views.find(t); v != views.end()) reads.insert(reads.end(), v->second.begin(), v->second.end());
      std::sort(reads.begin(), reads.end());
      reads.erase(std::unique(reads.begin(), reads.end()), reads.end());
      for (int t : p_.nodes[at(n)].outputs)
        if (!reads.empty() && !model_.is_internal(t) && !model_.owns_storage()[at(t)]) views[t] = reads;
    }
    for (int n = e_ - 1, next = -1; n >= b_; --n) {
      next_reader_[at(n - b_)] = next;
      if (!gather_reads_[at(n - b_)].empty()) next = n;
    }
    gathered_.assign(zero_buckets_.size(), 0);
    gather_unmade_.assign(zero_buckets_.size(), 0);
    for (int k : zero_bucket_of_)
      if (k >= 0) ++gather_unmade_[at(k)];
  }
  // Once the gradient exists (later micro-batches of a step), autograd sums the contributions
  // of a weight used by several nodes in a buffer before accumulating it: the buffer is filled
  // by the first of them in the backward and held until the last.
  hold_from_.assign(n_nodes, 0);
  hold_to_.assign(n_nodes, 0);
  for (auto& [owner, users] : tied_users) {
    const int64_t tied = p_.nodes[at(users.front())].tied_bytes;
    if (in_range(owner)) {
      // The owner's own contribution is a buffer of its own, summed into the users' gradient:
      // in place into an embedding's gradient, a sum of chunks' slices or a bf16 copy's
      // gradient, out of place (one buffer more) into a single fp32 linear's weight gradient.
      const bool out_of_place =
          users.size() == 1 && model_.node_class(users.front()) == NodeClass::Linear && p_.precision != Precision::Bf16;
      tied_sum_at_[at(owner - b_)] += tied * (out_of_place ? 2 : 1);
      users.push_back(owner);
    }
    if (users.size() < 2) continue;
    hold_from_[at(users.front() - b_)] += tied;
    hold_to_[at(users.back() - b_)] += tied;
  }
}

void StageReplay::place_evictions() {
  // Run after run (the planner replays many decision sets per stage): the buffers are reused.
  refs_ = base_refs_;
  placed_.resize(evictions_->size());
  evict_after_send_.clear();
  evict_after_.resize(static_cast<size_t>(e_ - b_));
  for (std::vector<int>& after : evict_after_) after.clear();
  for (size_t index = 0; index < placed_.size(); ++index) {
    const Eviction& ev = (*evictions_)[index];
    Placed& pl = placed_[index];
    pl.key = key_[at(ev.tensor)];
    if (local_[at(pl.key)] < 0)
      throw std::logic_error("stage replay: an eviction of a tensor the stage does not touch");
    pl.producer = p_.tensors[at(ev.tensor)].producer;
    pl.recompute = ev.action == TensorAction::Recompute;
    pl.due = ev.prefetch_at;
    pl.leaves.clear();
    for (int t : ev.leaves) pl.leaves.push_back(key_[at(t)]);
    std::sort(pl.leaves.begin(), pl.leaves.end());
    pl.leaves.erase(std::unique(pl.leaves.begin(), pl.leaves.end()), pl.leaves.end());
    for (int k : pl.leaves) ++refs_[loc(k)];
    if (ev.evict_after < 0)
      evict_after_send_.push_back(static_cast<int>(index));
    else
      evict_after_[at(ev.evict_after - b_)].push_back(static_cast<int>(index));
  }
  std::vector<int>& keys = due_scratch_;
  keys.clear();
  for (const Placed& pl : placed_) keys.push_back(pl.key);
  std::sort(keys.begin(), keys.end());
  shared_keys_ = std::adjacent_find(keys.begin(), keys.end()) != keys.end();
  // A backward walks the nodes downwards, and each eviction becomes due once the walk reaches
  // its due node.
  by_restore_.resize(placed_.size());
  for (size_t i = 0; i < by_restore_.size(); ++i) by_restore_[i] = static_cast<int>(i);
  std::sort(by_restore_.begin(), by_restore_.end(), [&](int a, int c) {  // ties in order, without a buffer
    return placed_[at(a)].due != placed_[at(c)].due ? placed_[at(a)].due > placed_[at(c)].due : a < c;
  });
}

void StageReplay::measure_messages() {
  received_bytes_ = sum_bytes(received_);
  sent_bytes_ = sum_bytes(sent_);
  // Gradients travel back only for tensors autograd tracks.
  for (const TensorBytes& r : received_)
    if (requires_grad_[at(r.tensor)]) received_grad_bytes_ += r.bytes;
  // A transposed view is sent as a contiguous copy (MPI reads one dense buffer).
  auto permuted = [&](int tensor) {
    const int contiguous = p_.tensors[at(tensor)].contiguous;
    if (contiguous >= 0) return contiguous == 0;                  // the profile says
    for (int t = tensor; t >= 0; t = p_.tensors[at(t)].alias_of)  // older profiles
      if (model_.node_class(p_.tensors[at(t)].producer) == NodeClass::Permute) return true;
    return false;
  };
  for (const TensorBytes& s : sent_) {
    if (permuted(s.tensor)) {
      permuted_sent_bytes_ += s.bytes;
      // Its gradient arrives contiguous; the runtime gives it the tensor's layout where that is a
      // permutation of all of its storage (not of a slice: a fused projection's query).
      if (requires_grad_[at(s.tensor)] && s.bytes == bytes(key_[at(s.tensor)])) {
        relaid_grads_.insert(std::upper_bound(relaid_grads_.begin(), relaid_grads_.end(), s.tensor), s.tensor);
        largest_permuted_grad_ = std::max(largest_permuted_grad_, s.bytes);
      }
    } else if (std::find(sent_originals_.begin(), sent_originals_.end(), key_[at(s.tensor)]) == sent_originals_.end()) {
      sent_originals_.push_back(key_[at(s.tensor)]);
    }
  }
}

void StageReplay::note(int64_t value, int node) {
  if (value > r_.peak) r_.peak = value, r_.peak_action = current_action_, r_.peak_node = node;
  if (rank_peak_) *rank_peak_ = std::max(*rank_peak_, value + others_live_);
  if (recording_ && (!recording_->noted || value - walk_start_ > recording_->high))
    recording_->noted = true, recording_->high = value - walk_start_, recording_->node = node;
  if (segment_ < 0 || segment_ > 1) return;
  Mark& mark = segment_ == 0 ? before_send_ : before_step_;
  if (value > mark.value) mark = {value, current_action_, node};
}

void StageReplay::emit(ActionKind kind, int64_t mb, int tensor) {
  if (events_) events_->push_back(Action{kind, x_, mb, tensor});
  if (events_ && event_live_) event_live_->push_back(live_);
}

MicroBatch& StageReplay::state(int64_t mb) {
  auto found = mbs_.find(mb);
  if (found != mbs_.end()) return found->second;
  MicroBatch& m = mbs_[mb];
  if (!spare_.empty()) {  // a retired state's buffers, without new allocations
    m = std::move(spare_.back());
    spare_.pop_back();
    m.received_grads = m.input_grads = m.version = 0;
    m.out.clear();
  }
  m.refs = refs_;
  m.alive.assign(static_cast<size_t>(locals_), 0);
  m.evicted.assign(static_cast<size_t>(locals_), 0);
  m.has_grad.assign(static_cast<size_t>(locals_), 0);
  m.permuted.assign(static_cast<size_t>(locals_), 0);
  m.grad_in_loss.assign(static_cast<size_t>(locals_), 0);
  m.held_for_weights.assign(static_cast<size_t>(e_ - b_), -1);
  m.weights_pending = m.gradients_sent = m.loss_grad_held = m.loss_saved_released = false;
  m.loss_read = m.loss_pending = false;
  return m;
}

void StageReplay::retire(int64_t mb) {
  auto found = mbs_.find(mb);
  if (found == mbs_.end()) return;
  spare_.push_back(std::move(found->second));
  mbs_.erase(found);
}

void StageReplay::release(MicroBatch& m, int k) {
  if (--m.refs[loc(k)] != 0 || !m.alive[loc(k)]) return;
  m.alive[loc(k)] = 0;
  if (!m.evicted[loc(k)]) live_ -= bytes(k);
}

void StageReplay::evict(MicroBatch& m, int64_t mb, int index) {
  const Placed& pl = placed_[at(index)];
  const size_t k = loc(pl.key);
  if (!m.alive[k] || m.evicted[k]) return;
  m.evicted[k] = 1;
  live_ -= bytes(pl.key);
  m.out.insert(std::lower_bound(m.out.begin(), m.out.end(), index), index);
  if (!pl.recompute) emit(ActionKind::SwapOut, mb, (*evictions_)[at(index)].tensor);
}

// Receives allocate the tensors they receive. A send keeps what it sends referenced until MPI
// completes it: found done by the send sends_in_flight later (the next one for most schedules; the
// receiver may not have taken it earlier), on a rank of several stages whichever stage sends.
void StageReplay::send(int64_t held_by_send, int64_t originals_of) {
  if (segment_ == 0) segment_ = 1;
  RankSends& rank = sends();
  while (rank.order.size() >= rank.depth) {
    rank.order.front()->complete_oldest_send();
    rank.order.pop_front();
  }
  rank.order.push_back(this);
  pending_sends_.push_back({held_by_send, originals_of});
}

void StageReplay::complete_oldest_send() {
  live_ -= pending_sends_.front().bytes;
  pending_sends_.pop_front();
}

// Before node i's backward the evictor brings back what it (or a later node's backward) reads:
// swaps, and recomputations re-running the union of their chains at once. Re-run nodes are
// shared: every evicted recomputation whose producer re-runs comes back now too, and a swapped
// tensor the chains read comes back early. `next_due`: the first of by_restore_ not yet due in
// this backward. Every eviction due at an earlier (higher) node was restored there, so only the
// newly due ones can be evicted still.
void StageReplay::restore_for(MicroBatch& m, int64_t mb, int i, size_t& next_due) {
  const size_t first_due = next_due;
  if (!collect_due(m, i, next_due)) return;
  if (rerun_scratch_.empty() && !shared_keys_) {
    swap_in_due(m, mb, i, first_due, next_due);
    return;
  }
  restore_with_rerun(m, mb, i);
}

// The evictions due before node i still out (next_due moves past them); the nodes their
// recomputations re-run, ascending and distinct, in rerun_scratch_. False: none is out.
bool StageReplay::collect_due(const MicroBatch& m, int i, size_t& next_due) {
  std::vector<int>& rerun_nodes = rerun_scratch_;
  rerun_nodes.clear();
  bool any = false;
  for (; next_due < by_restore_.size() && placed_[at(by_restore_[next_due])].due >= i; ++next_due) {
    const Placed& pl = placed_[at(by_restore_[next_due])];
    if (!m.evicted[loc(pl.key)] || !m.alive[loc(pl.key)]) continue;
    any = true;
    if (pl.recompute)
      for (int n : (*evictions_)[at(by_restore_[next_due])].rerun) rerun_nodes.push_back(n);
  }
  std::sort(rerun_nodes.begin(), rerun_nodes.end());
  rerun_nodes.erase(std::unique(rerun_nodes.begin(), rerun_nodes.end()), rerun_nodes.end());
  return any;
}

// Only swaps are due: they come back in the order the evictor starts them (read first first,
// ties in program order), nothing else moves. (Their entries stay in m.out; a storage back on
// the device is skipped there.)
void StageReplay::sort_copies_back(std::vector<int>& evictions) const {
  std::sort(evictions.begin(), evictions.end(), [&](int a, int c) {
    const int ra = (*evictions_)[at(a)].restore_before, rc = (*evictions_)[at(c)].restore_before;
    return ra != rc ? ra > rc : a < c;
  });
}

void StageReplay::swap_in_due(MicroBatch& m, int64_t mb, int i, size_t first_due, size_t next_due) {
  std::vector<int>& due = due_scratch_;
  due.clear();
  for (size_t d = first_due; d < next_due; ++d) {
    const Placed& pl = placed_[at(by_restore_[d])];
    if (m.evicted[loc(pl.key)] && m.alive[loc(pl.key)]) due.push_back(by_restore_[d]);
  }
  sort_copies_back(due);
  for (int j : due) {
    m.evicted[loc(placed_[at(j)].key)] = 0;
    live_ += bytes(placed_[at(j)].key);
    emit(ActionKind::SwapIn, mb, (*evictions_)[at(j)].tensor);
  }
  note(live_, i);
}

// Swaps come back first (those due, then those the re-run reads early, each in program order,
// as the evictor starts them); the re-run then allocates every output of its nodes in order (the
// rebuilt tensors among them), each node's workspace on top, and holds them all until the
// rebuilt bytes move into the evicted storages.
void StageReplay::restore_with_rerun(MicroBatch& m, int64_t mb, int i) {
  const std::vector<int>& rerun_nodes = rerun_scratch_;
  auto reruns = [&](int node) { return std::binary_search(rerun_nodes.begin(), rerun_nodes.end(), node); };
  std::vector<int>& chain_reads = chain_scratch_;  // storages, ascending, distinct
  chain_reads.clear();
  for (int n : rerun_nodes)
    for (int in : model_.inputs(n))
      if (!reruns(p_.tensors[at(in)].producer)) chain_reads.push_back(key_[at(in)]);
  std::sort(chain_reads.begin(), chain_reads.end());
  chain_reads.erase(std::unique(chain_reads.begin(), chain_reads.end()), chain_reads.end());
  int64_t swapped_back = 0, rebuilt_back = 0;
  std::vector<int> still_out, early, done, due;
  auto swap_in = [&](int j) {
    m.evicted[loc(placed_[at(j)].key)] = 0;
    swapped_back += bytes(placed_[at(j)].key);
    emit(ActionKind::SwapIn, mb, (*evictions_)[at(j)].tensor);
  };
  for (int j : m.out) {
    const Placed& pl = placed_[at(j)];
    if (!m.evicted[loc(pl.key)] || !m.alive[loc(pl.key)]) continue;  // released while off the device
    if (pl.recompute) {
      if (reruns(pl.producer)) {
        m.evicted[loc(pl.key)] = 0;
        rebuilt_back += bytes(pl.key);
        done.push_back(j);
      } else {
        still_out.push_back(j);
      }
    } else if (pl.due >= i) {
      due.push_back(j);
    } else if (std::binary_search(chain_reads.begin(), chain_reads.end(), pl.key)) {
      early.push_back(j);
    } else {
      still_out.push_back(j);
    }
  }
  sort_copies_back(due);
  for (int j : due) swap_in(j);
  for (int j : early) swap_in(j);
  m.out = std::move(still_out);
  live_ += swapped_back;
  note(live_, i);
  note_rerun(i);
  live_ += rebuilt_back;
  if (!done.empty()) emit(ActionKind::Recompute, mb, (*evictions_)[at(done.front())].tensor);
  for (int j : done)
    for (int k : placed_[at(j)].leaves) release(m, k);
}

// The re-run's outputs, allocated node by node with each node's workspace on top.
void StageReplay::note_rerun(int i) {
  const std::vector<int>& rerun_nodes = rerun_scratch_;
  auto reruns = [&](int node) { return std::binary_search(rerun_nodes.begin(), rerun_nodes.end(), node); };
  int64_t outputs = 0;
  for (int n : rerun_nodes) {
    if (zero_gathers()) {  // beside the re-run's outputs so far; held until its gradients are made
      live_ += outputs;
      gather_read(n);
      live_ -= outputs;
    }
    int64_t out = 0;
    for (int t : p_.nodes[at(n)].outputs)
      if (allocates(t)) out += bytes(t);
    // A re-run loss overwrites logits the re-run made: only the re-run's env holds them.
    int64_t saving = 0, overwritten = 0;
    if (n == loss_node_) {
      const int k = key_[at(loss_logits_)];
      if (!is_received_[at(k)] && reruns(p_.tensors[at(k)].producer) && base_refs_[loc(k)] == 1)
        saving = loss_saving_, overwritten = bytes(k);
    }
    note(live_ + outputs + out + p_.nodes[at(n)].fwd_workspace - saving, i);
    outputs += out - overwritten;
  }
}

template <class Body>
void StageReplay::walk_once(Walk& w, MicroBatch& m, bool backward, Body body) {
  if (!repeat_walks_) return body();
  if (w.done) {
    if (w.noted) note(live_ + w.high, w.node);
    live_ += w.delta;
    param_grads_ += w.param_grads;
    if (backward) grad_done_ = w.grad_done;
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
  w.after = m;
  w.done = true;
}

void StageReplay::forward(int64_t mb, MicroBatch& m) {
  if (stashes_) {
    m.version = version_;
    if (version_users_[version_]++ == 0) live_ += weights_;  // the stashed copy
  }
  walk_once(forward_walk_, m, /*backward=*/false, [&] { forward_nodes(mb, m); });
}

void StageReplay::forward_nodes(int64_t mb, MicroBatch& m) {
  for (int t : data_) m.alive[loc(t)] = 1, live_ += bytes(t);
  note(live_, -1);
  for (int n = b_; n < e_; ++n) {
    const NodeProfile& node = p_.nodes[at(n)];
    if (model_.node_class(n) == NodeClass::Input) continue;
    if (zero_gathers()) gather_read(n);
    int64_t out = 0;
    for (int t : node.outputs)
      if (allocates(t)) out += bytes(t);
    note(live_ + out + node.fwd_workspace - overwritten_logits(m, n), n);
    live_ += out;
    for (int t : node.outputs) {
      if (!allocates(t)) continue;
      m.alive[loc(t)] = 1;
      if (m.refs[loc(t)] == 0) m.alive[loc(t)] = 0, live_ -= bytes(t);
    }
    for (int i : evict_after_[at(n - b_)]) evict(m, mb, i);
    if (zero_gathers()) after_forward_node(n);
    for (int t : model_.inputs(n)) release(m, key_[at(t)]);
  }
  for (int t : data_read_later_) release(m, t);
}

// The zoo's loss writes fp32 log-probabilities over its logits when its executor holds the only
// handle on them (exec/stage_module.cpp), saving all but one chunk of rows of them. Not where
// the profile does not show fp32, contiguous logits (loss_inputs).
void StageReplay::find_loss() {
  for (int n = b_; n < e_; ++n) {
    if (model_.node_class(n) != NodeClass::InPlaceLoss) continue;
    const LossInputs in = loss_inputs(p_, n, model_.inputs(n));
    if (!in.fp32) continue;
    loss_node_ = n, loss_logits_ = in.logits;
    loss_saving_ = cross_entropy_overwrite_saving(bytes(key_[at(in.logits)]), bytes(in.labels));
  }
}

// In a forward, the logits die at the loss (no later reader, saver, send or recompute leaf holds
// their storage) and were not received (the stage holds those until their gradient is sent).
int64_t StageReplay::overwritten_logits(const MicroBatch& m, int n) const {
  if (n != loss_node_) return 0;
  const int k = key_[at(loss_logits_)];
  if (is_received_[at(k)] || !m.alive[loc(k)] || m.evicted[loc(k)] || m.refs[loc(k)] != 1) return 0;
  return loss_saving_;
}

void StageReplay::backward(int64_t mb, MicroBatch& m) {
  if (begin_weight_pass())  // (walked apart from the repeated walks)
    backward_nodes(mb, m);
  else
    walk_once(backward_walk_[backward_in_step_ ? 1 : 0], m, /*backward=*/true, [&] { backward_nodes(mb, m); });
  backward_in_step_ = true;
  if (stashes_ && --version_users_[m.version] == 0) {
    version_users_.erase(m.version);
    live_ -= weights_;
  }
}

void StageReplay::backward_nodes(int64_t mb, MicroBatch& m, bool input_only) {
  size_t next_due = 0;
  // The loss's stage starts its backward (B or I) from the loss times the schedule's scale, with
  // a seed gradient of ones (runtime/pipeline_stage.cpp): both live until it ends, and the
  // loss's own gradient until the loss's backward has run.
  const int64_t roots = last_ ? 2 * bytes(loss_) : 0;
  const int loss_producer = last_ ? p_.tensors[at(loss_)].producer : -1;
  live_ += roots;
  for (int i = e_ - 1; i >= b_; --i) {
    if (!model_.has_backward(i)) continue;
    // Autograd runs in I only what leads to a tracked input: the rest waits for W.
    if (!input_only || !weight_only_[at(i - b_)]) restore_for(m, mb, i, next_due);
    if (zero_gathers()) gather_read(i);  // where its output's gradient arrives
    const int64_t loss_grad = i == loss_producer ? bytes(loss_) : 0;
    live_ += loss_grad;
    backward_node(m, i, input_only);
    live_ -= loss_grad;
  }
  // A received tensor relayed as it is, read by nothing here: its gradient is the one received,
  // held until sent back.
  for (const TensorBytes& s : sent_)
    if (is_received_[at(s.tensor)] && m.has_grad[loc(s.tensor)] == 2) {
      m.received_grads -= s.bytes;
      m.input_grads += s.bytes;
    }
  live_ -= m.received_grads + roots;
  m.received_grads = 0;
  if (!input_only) {
    release_graph(m);
    zero_end_micro_batch();
    if (zero_gathers()) release_gathered();
    return;
  }
  // I kept the graph while it ran; what the parameter readers saved stays for W, and so do the
  // log-probabilities holding the logits' gradient that a reader holds (loss_grad_held).
  for (int i = e_ - 1; i >= b_; --i)
    if (model_.has_backward(i) && !reads_params_[at(i - b_)])
      for (int t : p_.nodes[at(i)].saved)
        if (!((m.loss_grad_held || m.loss_saved_released) && i == loss_node_ && model_.is_internal(t)))
          for_saver_keys(t, [&](int k) { release(m, k); });
}

void StageReplay::release_graph(MicroBatch& m) {
  if (m.weights_pending)  // I kept what the parameter readers saved
    for (int i = e_ - 1; i >= b_; --i)
      if (model_.has_backward(i) && reads_params_[at(i - b_)])
        for (int t : p_.nodes[at(i)].saved) for_saver_keys(t, [&](int k) { release(m, k); });
  for (const TensorBytes& s : sent_) release(m, key_[at(s.tensor)]);
  if (last_ && --m.refs[loc(loss_)] == 0 && m.alive[loc(loss_)]) m.alive[loc(loss_)] = 0, m.loss_pending = true;
  if (m.weights_pending && m.gradients_sent)
    for (const TensorBytes& t : received_)
      if (requires_grad_[at(t.tensor)]) release(m, t.tensor);
}

// W: each parameter-reading node whose output got a gradient makes its parameters' gradients
// from it (in the backward's order, as the runtime's weight pass runs), then lets it go.
void StageReplay::weight_nodes(int64_t mb, MicroBatch& m) {
  size_t next_due = 0;
  for (int i = e_ - 1; i >= b_; --i) {
    const int64_t held = m.held_for_weights[at(i - b_)];
    if (held < 0) continue;
    if (weight_only_[at(i - b_)]) restore_for(m, mb, i, next_due);  // what I left evicted
    int64_t grads = 0, transient = tied_sum_at_[at(i - b_)];
    param_gradient(i, grads, transient);
    note(live_ + grads + transient + p_.nodes[at(i)].bwd_workspace, i);
    live_ += grads;
    if (zero_streams()) zero_gradient_made(i);  // (the weight pass still holds the output's gradient)
    average_gradient_made(i);
    live_ -= held;
  }
  if (m.loss_grad_held)
    for (int t : p_.nodes[at(loss_node_)].saved)
      if (model_.is_internal(t)) for_saver_keys(t, [&](int k) { release(m, k); });
  m.loss_grad_held = false;
  average_pass_end();  // (the runtime's W lets its graph go after)
  release_graph(m);
  m.weights_pending = false;
  zero_end_micro_batch();
}

// Node i's backward: the gradients of its inputs and parameters appear, its output's gradient
// is consumed, what it saved is released.
// A node whose backward slices the gradient it made (find_sliced_gradients): its inputs get
// slices, the received ones copies held until sent back.
void StageReplay::backward_slices(MicroBatch& m, int i) {
  const int out = model_.graph_output(i);
  int64_t copies = 0;  // received inputs' gradients, held until sent back
  for (int t : model_.inputs(i)) {
    m.has_grad[loc(t)] = is_received_[at(t)] ? 1 : 3;
    if (is_received_[at(t)]) copies += bytes(t);
  }
  note(live_ + copies + p_.nodes[at(i)].bwd_workspace, i);
  live_ += copies;
  m.input_grads += copies;
  if (slices_gradient_[at(i - b_)] == 2 && !m.grad_in_loss[loc(out)]) live_ -= bytes(out);
}

// What node i's backward gives its inputs: new gradients, sums into existing ones, or (a view)
// its output's gradient handed on.
StageReplay::InputGradients StageReplay::input_gradients(MicroBatch& m, int i, bool view, bool input_only) {
  const NodeClass kind = model_.node_class(i);
  const int out = model_.graph_output(i);
  const char out_grad = m.has_grad[loc(out)];
  InputGradients r;
  // A view's gradient goes to the tensor it views alone: type_as, expand_as and view_as read
  // another tensor only for its type or shape.
  const int viewed = view ? p_.tensors[at(out)].alias_of : -1;
  for (int t : model_.inputs(i)) {
    if (!requires_grad_[at(t)] || (viewed >= 0 && t != viewed)) continue;
    char& g = m.has_grad[loc(t)];
    if (g) {  // this node's contribution is summed into the existing gradient
      if (view) continue;
      r.transient += bytes(t);
      if (g == 2) {  // out of place: the stage still holds the received one
        r.grads += bytes(t), g = 1;
        // A tensor relayed to the next stage and read here: the sum is what goes back.
        if (is_received_[at(t)]) m.input_grads += bytes(t);
      }
      continue;
    }
    r.passed_on = true;
    if (is_received_[at(t)]) m.input_grads += bytes(t);  // held until sent back
    if (!view) {
      g = 1, r.grads += bytes(t);
    } else if (kind == NodeClass::Reshape && m.permuted[loc(out)]) {
      g = 1, r.grads += bytes(t), r.copied_view = true;  // a permuted gradient is not viewable
    } else {                                             // a view of the output's gradient, with its owner
      g = out_grad ? out_grad : 1;
      // A received tensor relayed as a view: its gradient is a view of the received one, which is
      // then held until sent back (input_grads), not freed when the backward ends.
      if (out_grad == 2 && is_received_[at(t)]) m.received_grads -= bytes(t);
      // In I, a received gradient in its tensor's own (permuted) layout, permuted back, is dense
      // in the order the view's input has: the view before it hands it on (measured; a whole
      // backward copies it, as counted).
      const bool relaid =
          input_only && out_grad == 2 && std::binary_search(relaid_grads_.begin(), relaid_grads_.end(), out);
      m.permuted[loc(t)] = !relaid && (m.permuted[loc(out)] || kind == NodeClass::Permute);
      m.grad_in_loss[loc(t)] = m.grad_in_loss[loc(out)];  // an imported head's reshape of the logits
    }
  }
  return r;
}

// The larger of the node's whole-backward and I workspaces, in B and in I. I keeps what the
// node's autograd functions saved until its end (GPT-2's attention with dropout on CPU, several
// functions: its I workspace is 6x its whole backward's). A whole backward frees that as it
// goes, but the profiler's whole backward, its inputs' gradients accumulated into leaves that are
// strided views of larger storages, can hide the node's transient behind those leaves' gradients
// (the same attention under 1f1b measured above its replay). Where bwd_workspace is the larger
// (those leaves' gradient buffers), the replay's I relies on it: with the I workspace alone,
// Llama's rotary slices measure up to 2.1% above their zb-h1 replay (a concat's gradient that
// lives longer in I than the replay counts; not explained yet).
int64_t StageReplay::backward_workspace(const NodeProfile& node) {
  return std::max(node.bwd_workspace, input_workspace(node));
}

void StageReplay::backward_node(MicroBatch& m, int i, bool input_only) {
  const NodeProfile& node = p_.nodes[at(i)];
  const NodeClass kind = model_.node_class(i);
  const int out = model_.graph_output(i);
  if (slices_gradient_[at(i - b_)] && m.has_grad[loc(out)] == 1) {  // slices of the gradient it made
    backward_slices(m, i);
    return;
  }
  // A view hands its output's gradient on as a view, unless its backward allocates one of the
  // input's size (slices, expands, splits).
  const bool view = !model_.owns_storage()[at(out)] && kind != NodeClass::ViewAllocatingGradient;
  const char out_grad = m.has_grad[loc(out)];
  InputGradients in = input_gradients(m, i, view, input_only);
  int64_t grads = in.grads, transient = in.transient;
  const bool passed_on = in.passed_on, copied_view = in.copied_view;
  // I holds a parameter-reading node's output gradient for W: nothing is written over it.
  const bool holds = input_only && reads_params_[at(i - b_)];
  // A view of a parameter (Falcon's transposed weights), or summed into a gradient: the
  // gradient is done with, but that of a parameter's view, which I holds for W.
  const bool param_view_grad = view && !passed_on && out_grad == 1;
  if (param_view_grad && !holds) live_ -= bytes(out);
  if (!input_only) {
    param_gradient(i, grads, transient);
    transient += tied_sum_at_[at(i - b_)];
  }
  // Written over the output's gradient, which the stage made: no new storage for the input's.
  int64_t reused = 0;
  if (in_place_grad_[at(i - b_)] && out_grad == 1 && requires_grad_[at(model_.inputs(i)[0])] && !holds)
    reused = bytes(model_.inputs(i)[0]);
  // The loss writes the logits' gradient over its log-probabilities (fp32).
  if (i == loss_node_ && requires_grad_[at(loss_logits_)]) reused = bytes(loss_logits_);
  // A slice of a concat's gradient (find_sliced_gradients) is copied first; the copy of the
  // last slice read frees the whole gradient before the products run.
  // I holds the slices for W: the whole gradient lives until then (freed at this node's W).
  int64_t slices_held = 0;
  if (out >= 0 && m.has_grad[loc(out)] == 3) {
    transient += bytes(out);
    if (frees_slices_of_[at(i - b_)] >= 0) {
      const int concat = model_.graph_output(frees_slices_of_[at(i - b_)]);
      const int64_t whole = bytes(concat);
      if (holds && m.grad_in_loss[loc(concat)]) {
        m.loss_grad_held = true;
      } else if (holds) {
        slices_held = whole;
      } else if (!m.grad_in_loss[loc(concat)]) {  // (else freed with the loss's log-probabilities)
        note(live_ + bytes(out), i);
        live_ -= whole;
      }
    }
  }
  note(live_ + grads + transient + backward_workspace(node) - reused, i);
  live_ += grads;
  if (input_only && i == loss_node_ && reused > 0) {
    if (is_received_[at(key_[at(loss_logits_)])]) {
      // Received logits: their gradient goes back in the log-probabilities' buffer, which it
      // owns from here, as in a whole backward.
      for (int t : node.saved)
        if (model_.is_internal(t)) for_saver_keys(t, [&](int k) { release(m, k); });
      m.loss_saved_released = true;
    } else {  // no storage of its own
      live_ -= reused;
      m.grad_in_loss[loc(loss_logits_)] = 1;
    }
  }
  if (holds) {
    // W runs from here (also from a loss, whose seed gradient the replay does not count).
    int64_t& held = m.held_for_weights[at(i - b_)];
    held = std::max<int64_t>(held, 0) + slices_held;
    for (int o : node.outputs) {
      if (model_.is_internal(o) || is_received_[at(o)] || !m.has_grad[loc(o)]) continue;
      if (m.grad_in_loss[loc(o)]) {  // in the loss's log-probabilities
        m.loss_grad_held = true;
        continue;
      }
      if (m.has_grad[loc(o)] == 2) {  // a received gradient: held past the end of I
        held += bytes(o);
        m.received_grads -= bytes(o);
      } else if (m.has_grad[loc(o)] == 1 && (!view || copied_view || (param_view_grad && o == out))) {
        held += bytes(o);
      }
    }
    return;  // what it saved stays for W
  }
  for (int o : node.outputs)  // the graph outputs' gradients have been consumed
    if (!model_.is_internal(o) && m.has_grad[loc(o)] == 1 && (!view || copied_view) && !is_received_[at(o)] &&
        !m.grad_in_loss[loc(o)])  // (that one goes with the loss's log-probabilities)
      live_ -= bytes(o);
  if (!input_only)  // I lets them go at its end (backward_nodes)
    for (int t : node.saved) for_saver_keys(t, [&](int k) { release(m, k); });
  // Autograd accumulates the parameters' gradients once the node's function has let its
  // inputs and saved tensors go.
  if (!input_only && zero_gathers()) gather_released(i);
  if (!input_only && zero_streams()) zero_gradient_made(i);
  if (!input_only) average_gradient_made(i);
}

void StageReplay::param_gradient(int i, int64_t& grads, int64_t& transient) {
  const int64_t pg = grad_at_[at(i - b_)];
  if (!grad_done_[at(i - b_)] || zero_streamed(i)) {  // (level 2: released after each micro-batch)
    grad_done_[at(i - b_)] = 1;
    grads += pg;
    param_grads_ += pg;
  } else {  // accumulated into the existing gradient
    const int64_t held = hold_from_[at(i - b_)], summed = hold_to_[at(i - b_)];
    transient += pg - held + summed;
    grads += held;
    live_ -= summed;
  }
}

void StageReplay::place_zero_buckets(std::vector<int64_t> param_bytes) {
  zero_buckets_.clear();
  zero_bucket_grads_.clear();
  zero_deferred_.clear();
  zero_order_.clear();
  zero_bucket_of_.clear();
  zero_shard_ = 0;
  if (model_.zero_stage() == 0) return;
  // Level 2: the nodes holding a weight tied across stages (a copy, or an owner another stage
  // copies): their buckets wait for the update, after the stages' sum.
  std::vector<char> tied_across(param_bytes.size(), 0);
  if (zero_streams())
    for (int n = 0; n < static_cast<int>(p_.nodes.size()); ++n) {
      const int owner = p_.nodes[at(n)].tied_owner;
      if (owner < 0 || in_range(owner) == in_range(n)) continue;
      if (in_range(n)) tied_across[at(n - b_)] = 1;
      if (in_range(owner)) tied_across[at(owner - b_)] = 1;
    }
  zero_bucket_of_.assign(param_bytes.size(), -1);
  const int64_t d = model_.data_parallel(), unit = 4 * d;  // each replica's chunk: whole fp32 elements
  int64_t open = 0;
  bool deferred = false;
  auto close = [&] {
    if (open > 0) {
      zero_buckets_.push_back((open + unit - 1) / unit * unit), zero_shard_ += zero_buckets_.back() / d;
      zero_bucket_grads_.push_back(open);
      zero_deferred_.push_back(deferred);
    }
    open = 0;
    deferred = false;
  };
  for (size_t j = 0; j < param_bytes.size(); ++j) {
    if (param_bytes[j] == 0) continue;
    zero_bucket_of_[j] = static_cast<int>(zero_buckets_.size());
    deferred = deferred || tied_across[j];
    if ((open += param_bytes[j]) >= model_.bucket_bytes()) close();
  }
  close();
  for (size_t k = zero_buckets_.size(); k-- > 0;)
    if (!zero_deferred_[k]) zero_order_.push_back(k);
  zero_made_.assign(param_bytes.size(), 0);
  zero_chunk_held_.assign(zero_buckets_.size(), 0);
  zero_waiting_.assign(zero_buckets_.size(), 0);
  zero_end_micro_batch();  // (sets the counts)
}

void StageReplay::place_average_buckets(const std::vector<int64_t>& param_bytes) {
  avg_buckets_.clear();
  avg_deferred_.clear();
  avg_order_.clear();
  avg_bucket_of_.assign(param_bytes.size(), -1);
  avg_passes_per_step_ = 0;
  if (!averages_buckets()) return;
  if (model_.schedule().traits().updates_once_per_step && !stream_)
    for (const Action& a : actions_)
      avg_passes_per_step_ += a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardWeight;
  // As the runtime's shard_layout with one replica: whole nodes' parameters, closed once they
  // reach the bucket size; a bucket holding a weight tied across stages waits for the pass's end.
  std::vector<char> tied_across(param_bytes.size(), 0);
  for (int n = 0; n < static_cast<int>(p_.nodes.size()); ++n) {
    const int owner = p_.nodes[at(n)].tied_owner;
    if (owner < 0 || in_range(owner) == in_range(n)) continue;
    if (in_range(n)) tied_across[at(n - b_)] = 1;
    if (in_range(owner)) tied_across[at(owner - b_)] = 1;
  }
  int64_t open = 0;
  bool deferred = false;
  auto close = [&] {
    if (open > 0) avg_buckets_.push_back(open), avg_deferred_.push_back(deferred);
    open = 0;
    deferred = false;
  };
  for (size_t j = 0; j < param_bytes.size(); ++j) {
    if (param_bytes[j] == 0) continue;
    avg_bucket_of_[j] = static_cast<int>(avg_buckets_.size());
    deferred = deferred || tied_across[j];
    if ((open += param_bytes[j]) >= model_.bucket_bytes()) close();
  }
  close();
  for (size_t k = avg_buckets_.size(); k-- > 0;)
    if (!avg_deferred_[k]) avg_order_.push_back(k);
  for (size_t k = 0; k < avg_buckets_.size(); ++k)
    if (avg_deferred_[k]) avg_order_.push_back(k);
  avg_packed_.assign(avg_buckets_.size(), 0);
  avg_waiting_.assign(avg_buckets_.size(), 0);
}

bool StageReplay::begin_weight_pass() {
  avg_armed_ = false;
  if (avg_buckets_.empty() || avg_passes_per_step_ == 0) return false;
  const bool last = ++avg_passes_ == avg_passes_per_step_;
  if (!last) return false;
  avg_armed_ = true;
  avg_next_ = 0;
  std::fill(avg_waiting_.begin(), avg_waiting_.end(), 0);
  for (int k : avg_bucket_of_)
    if (k >= 0) ++avg_waiting_[at(k)];
  for (size_t k = 0; k < avg_buckets_.size(); ++k)
    if (avg_deferred_[k]) avg_waiting_[k] = 1;  // (never 0: packed at the pass's end)
  return true;
}

void StageReplay::average_gradient_made(int i) {
  if (!avg_armed_) return;
  const int k = avg_bucket_of_[at(i - b_)];
  if (k < 0 || avg_deferred_[at(k)]) return;
  --avg_waiting_[at(k)];
  while (avg_next_ < avg_order_.size() && avg_waiting_[avg_order_[avg_next_]] == 0)
    average_pack(avg_order_[avg_next_++]);
}

// The runtime's MpiAverager::start_bucket: the buffer beside the gradients it copies, which then
// go (the same bytes).
void StageReplay::average_pack(size_t k) {
  note(live_ + avg_buckets_[k], -1);
  avg_packed_[k] = 1;
}

void StageReplay::average_pass_end() {
  if (avg_passes_per_step_ == 0 || avg_passes_ != avg_passes_per_step_ || avg_next_ > avg_order_.size()) return;
  for (size_t k : avg_order_)
    if (!avg_packed_[k]) average_pack(k);
  avg_armed_ = false;
  avg_next_ = avg_order_.size() + 1;  // (done)
}

void StageReplay::zero_gradient_made(int i) {
  const int k = zero_bucket_of_[at(i - b_)];
  if (k < 0 || zero_deferred_[at(k)] || zero_made_[at(i - b_)]) return;
  zero_made_[at(i - b_)] = 1;
  --zero_waiting_[at(k)];
  while (zero_next_ < zero_order_.size() && zero_waiting_[zero_order_[zero_next_]] == 0)
    zero_start(zero_order_[zero_next_++]);
}

// The runtime's ZeroShard::start: the bucket's chunk of the shard (zeros) at its first start in
// the step, its buffer beside its gradients, which it then releases; two buckets travel at most.
void StageReplay::zero_start(size_t k) {
  if (!zero_chunk_held_[k]) live_ += zero_buckets_[k] / model_.data_parallel(), zero_chunk_held_[k] = 1;
  note(live_ + zero_buckets_[k], -1);
  live_ += zero_buckets_[k] - zero_bucket_grads_[k];
  param_grads_ -= zero_bucket_grads_[k];
  zero_travelling_.push_back(zero_buckets_[k]);
  if (zero_travelling_.size() >= 2) live_ -= zero_travelling_.front(), zero_travelling_.pop_front();
}

// After a micro-batch's weight gradients (ZeroShard::end_micro_batch): what has not started
// starts, and everything completes.
void StageReplay::zero_end_micro_batch() {
  if (!zero_streams()) return;
  while (zero_next_ < zero_order_.size()) zero_start(zero_order_[zero_next_++]);
  while (!zero_travelling_.empty()) live_ -= zero_travelling_.front(), zero_travelling_.pop_front();
  zero_next_ = 0;
  std::fill(zero_made_.begin(), zero_made_.end(), 0);
  std::fill(zero_waiting_.begin(), zero_waiting_.end(), 0);
  for (int k : zero_bucket_of_)
    if (k >= 0) ++zero_waiting_[at(k)];
}

void StageReplay::gather_read(int i) {
  for (int k : gather_reads_[at(i - b_)]) {
    if (gathered_[at(k)]) continue;
    live_ += zero_buckets_[at(k)];
    note(live_, i);
    gathered_[at(k)] = 1;
  }
}

void StageReplay::after_forward_node(int i) {
  if (gather_reads_[at(i - b_)].empty()) return;
  const int next = next_reader_[at(i - b_)];
  for (size_t k = 0; k < gathered_.size(); ++k) {
    if (!gathered_[k]) continue;
    const std::vector<int>* keep = next >= 0 ? &gather_reads_[at(next - b_)] : nullptr;
    if (keep && std::binary_search(keep->begin(), keep->end(), static_cast<int>(k))) continue;
    live_ -= zero_buckets_[k];
    gathered_[k] = 0;
  }
}

void StageReplay::gather_released(int i) {
  const int k = zero_bucket_of_[at(i - b_)];
  if (k < 0 || --gather_unmade_[at(k)] != 0 || !gathered_[at(k)]) return;
  live_ -= zero_buckets_[at(k)];
  gathered_[at(k)] = 0;
}

void StageReplay::release_gathered() {
  for (size_t k = 0; k < gathered_.size(); ++k)
    if (gathered_[k]) live_ -= zero_buckets_[k], gathered_[k] = 0;
  std::fill(gather_unmade_.begin(), gather_unmade_.end(), 0);
  for (int k : zero_bucket_of_)
    if (k >= 0) ++gather_unmade_[at(k)];
}

void StageReplay::optimizer_step() {
  if (segment_ >= 0) segment_ = 2;
  for (size_t k : avg_order_)  // the averaging packs what no pass packed, then waits
    if (!avg_packed_[k]) average_pack(k);
  std::fill(avg_packed_.begin(), avg_packed_.end(), 0);
  avg_passes_ = 0;
  const bool zero = model_.zero_stage() > 0;
  if (zero) {
    // The gradients reduce-scattered into the shard a bucket at a time: bucket k's buffer with
    // k - 1's still travelling, whose gradients (about its size) are released by then.
    // From the second step on the optimizer state is there already (this pass is walked once).
    // Level 2: only the buckets that waited for the update; the shard is there already where
    // a bucket streamed.
    int64_t largest = 0;
    for (size_t k = 0; k < zero_buckets_.size(); ++k)
      if (!zero_streams() || zero_deferred_[k]) largest = std::max(largest, zero_buckets_[k]);
    int64_t shard = zero_shard_;
    for (size_t k = 0; k < zero_buckets_.size(); ++k)
      if (zero_streams() && !zero_deferred_[k]) shard -= zero_buckets_[k] / model_.data_parallel();
    note(live_ + shard + largest + (optimizer_state_ ? 0 : optimizer_state_bytes()), -1);
    live_ += shard - param_grads_;
    param_grads_ = 0;
    std::fill(zero_chunk_held_.begin(), zero_chunk_held_.end(), 0);
  }
  const int64_t state_bytes = optimizer_state_bytes();
  if (!optimizer_state_) live_ += state_bytes, optimizer_state_ = true;
  if (optimizer_has_moments(model_.optimizer()))
    note(live_ + std::min(p_.largest_param_bytes, zero ? zero_shard_ : weights_), -1);
  note(live_, -1);
  live_ -= param_grads_;
  param_grads_ = 0;
  if (zero) {
    // The shard's gradients go; the parameters are all-gathered a bucket at a time, each
    // bucket's chunk and gathered buffer with the previous bucket's still travelling (level 3:
    // where they are read).
    live_ -= zero_shard_;
    const int64_t d = model_.data_parallel();
    for (size_t k = 0; k < (zero_gathers() ? 0 : zero_buckets_.size()); ++k) {
      int64_t held = zero_buckets_[k] + zero_buckets_[k] / d;
      if (k > 0) held += zero_buckets_[k - 1] + zero_buckets_[k - 1] / d;
      note(live_ + held, -1);
    }
  }
  std::fill(grad_done_.begin(), grad_done_.end(), 0);
  backward_in_step_ = false;
  ++version_;
}

// The walk's state, fresh (buffers of earlier runs are kept).
void StageReplay::reset_walk() {
  while (!mbs_.empty()) retire(mbs_.begin()->first);
  r_ = StageMemoryReplay{};
  current_action_ = -1;
  pending_sends_.clear();
  own_sends_.order.clear();
  param_grads_ = version_ = 0;
  avg_passes_ = 0;
  std::fill(avg_packed_.begin(), avg_packed_.end(), 0);
  losses_held_ = held_loss_bytes_ = 0;
  optimizer_state_ = backward_in_step_ = false;
  std::fill(zero_chunk_held_.begin(), zero_chunk_held_.end(), 0);
  version_users_.clear();
  for (Walk* w :
       {&forward_walk_, &backward_walk_[0], &backward_walk_[1], &input_walk_, &weight_walk_[0], &weight_walk_[1]})
    w->done = w->noted = false;
  recording_ = nullptr;
  before_send_ = before_step_ = Mark{};
  segment_ = -1;
  // Constants: computed in the first forward. The device runtime's workspaces: allocated at the
  // first product, held from then on (counted from the start: the first product comes early).
  live_ = weights_ + model_.constant_bytes(b_, e_) + model_.runtime_bytes();
  note(live_, -1);
  if (zero_gathers()) {
    // Built whole, the shard copied out, then each bucket's parameters moved into its storage
    // (allocated while they move) and let go (runtime/zero_shard.h).
    const int64_t largest = zero_buckets_.empty() ? 0 : *std::max_element(zero_buckets_.begin(), zero_buckets_.end());
    note(live_ + zero_shard_ + largest, -1);
    live_ += zero_shard_ - weights_;
    std::fill(gathered_.begin(), gathered_.end(), 0);
    release_gathered();
  }
  grad_done_.assign(static_cast<size_t>(e_ - b_), 0);
}

StageMemoryReplay StageReplay::run(const std::vector<Eviction>& evictions) {
  evictions_ = &evictions;
  place_evictions();
  reset_walk();
  // Synchronous schedules: the list is one step; the second pass is the steady state (optimizer
  // state allocated). The async list runs long enough to reach its own. Without events to
  // record, the second pass is not walked: it repeats the first up to the step with the
  // optimizer state on top, and before its first send also what the last send of the first
  // still holds; from its step on it is the first pass again.
  const bool derive_second = !stream_ && !events_;
  const size_t passes = stream_ || derive_second ? 1 : 2;
  if (derive_second) segment_ = 0;
  repeat_walks_ = !events_;
  for (size_t ai = 0; ai < passes * actions_.size(); ++ai) {
    current_action_ = static_cast<int>(ai % actions_.size());
    run_action(actions_[static_cast<size_t>(current_action_)], *this);
    note(live_, -1);
  }
  if (derive_second) {
    const int64_t state_bytes = optimizer_state_bytes();
    for (const auto& [mark, extra] :
         {std::pair{before_send_, state_bytes + pending_send_bytes()}, {before_step_, state_bytes}})
      if (mark.action >= 0 && mark.value + extra > r_.peak)
        r_.peak = mark.value + extra, r_.peak_action = mark.action, r_.peak_node = mark.node;
  }
  return r_;
}

void StageReplay::begin(const std::vector<Eviction>& evictions, int64_t* rank_peak, RankSends* rank_sends) {
  evictions_ = &evictions;
  place_evictions();
  rank_peak_ = nullptr;
  reset_walk();
  repeat_walks_ = false;  // the walks' starting states depend on the other stages' order
  rank_peak_ = rank_peak;
  rank_sends_ = rank_sends;
}

void StageReplay::step(const Action& a, int index, int64_t others_live) {
  others_live_ = others_live;
  current_action_ = index;
  run_action(a, *this);
  note(live_, -1);
}

void StageReplay::recv_activation(const Action& a) {
  MicroBatch& m = state(a.micro_batch);
  live_ += received_bytes_;
  for (const TensorBytes& t : received_) m.alive[loc(t.tensor)] = 1;
}

void StageReplay::forward(const Action& a) {
  forward(a.micro_batch, state(a.micro_batch));
  if (last_) ++losses_held_, state(a.micro_batch).loss_read = false;
  if (r_.first_forward_end == 0) r_.first_forward_end = live_;
}

void StageReplay::send_grad(const Action& a) {
  MicroBatch& m = state(a.micro_batch);
  // Every received activation autograd tracks gets a gradient back (zeros where none flowed); the
  // sent gradients live until the send completes.
  live_ += received_grad_bytes_ - m.input_grads;
  send(received_grad_bytes_, std::numeric_limits<int64_t>::min());
  // Autograd holds the received tensors it tracks (their gradients' accumulators do) as long as
  // the graph lives: after a split backward's I, until its W.
  for (const TensorBytes& t : received_)
    if (!m.weights_pending || !requires_grad_[at(t.tensor)]) release(m, t.tensor);
  m.gradients_sent = true;
  if (!m.weights_pending) retire(a.micro_batch);
}

void StageReplay::send_activations(int64_t mb) {
  MicroBatch& m = state(mb);
  // The activations stay referenced by the micro-batch anyway; sent tensors the evictor empties
  // next are sent as copies.
  const int64_t copies = evict_after_send_.empty() ? permuted_sent_bytes_ : sent_bytes_;
  live_ += copies;
  send(copies, evict_after_send_.empty() ? mb : std::numeric_limits<int64_t>::min());
  for (int i : evict_after_send_) evict(m, mb, i);
}

void StageReplay::receive_gradients(int64_t mb) {
  MicroBatch& m = state(mb);
  int64_t total = 0;
  for (const TensorBytes& t : sent_)
    if (requires_grad_[at(t.tensor)]) total += t.bytes, m.has_grad[loc(t.tensor)] = 2;
  live_ += total;
  m.received_grads = total;
  note(live_ + largest_permuted_grad_, -1);
}

void StageReplay::backward_action(int64_t mb) {
  MicroBatch& m = state(mb);
  backward(mb, m);
  graph_released(mb, m);
  average_pass_end();
  read_losses();
}

// After a backward (B or I): the step's losses are read once the runtime holds them all.
void StageReplay::read_losses() {
  if (!last_ || losses_held_ < losses_per_read_) return;
  live_ -= held_loss_bytes_;
  losses_held_ = held_loss_bytes_ = 0;
  for (auto& [id, m] : mbs_) m.loss_read = true;
}

// Activations sent as they are stay referenced by the transport until their send completes:
// where the backward freed them (the step's last forward sent them), they are held until then.
void StageReplay::graph_released(int64_t mb, MicroBatch& m) {
  if (m.loss_pending) {  // its loss goes now if read, else when read
    m.loss_pending = false;
    if (m.loss_read)
      live_ -= bytes(loss_);
    else
      held_loss_bytes_ += bytes(loss_);
  }
  for (PendingSend& p : pending_sends_)
    if (p.originals_of == mb)
      for (int k : sent_originals_)
        if (!m.alive[loc(k)] && !m.evicted[loc(k)]) live_ += bytes(k), p.bytes += bytes(k);
  if (b_ == 0) retire(mb);  // nothing to send back
}

void StageReplay::backward_input(const Action& a) {
  MicroBatch& m = state(a.micro_batch);
  walk_once(input_walk_, m, /*backward=*/false, [&] { backward_nodes(a.micro_batch, m, /*input_only=*/true); });
  m.weights_pending = true;
  m.gradients_sent = false;
  read_losses();
}

void StageReplay::backward_weight(const Action& a) {
  MicroBatch& m = state(a.micro_batch);
  const bool sent = m.gradients_sent;  // a repeated walk restores the state it recorded
  if (begin_weight_pass())
    weight_nodes(a.micro_batch, m);
  else
    walk_once(weight_walk_[backward_in_step_ ? 1 : 0], m, /*backward=*/true, [&] { weight_nodes(a.micro_batch, m); });
  backward_in_step_ = true;
  graph_released(a.micro_batch, m);
  if (b_ > 0 && sent) retire(a.micro_batch);
}

}  // namespace detail

StageReplayer::StageReplayer(const CostModel& model, int b, int e, int x)
    : replay_(std::make_unique<detail::StageReplay>(model, b, e, x, model.actions(x), nullptr)) {}

StageReplayer::~StageReplayer() = default;
StageReplayer::StageReplayer(StageReplayer&&) noexcept = default;
StageReplayer& StageReplayer::operator=(StageReplayer&&) noexcept = default;

StageMemoryReplay StageReplayer::replay(const std::vector<TensorDecision>& decisions) {
  return replay_->run(replay_->place(decisions));
}

StageMemoryReplay replay_stage_program(const CostModel& model, const StageProgram& program, std::vector<Action>* events,
                                       std::vector<int64_t>* event_live) {
  return detail::StageReplay(model, program.begin, program.end, program.stage, program.actions, events, event_live)
      .run(program.evictions);
}

int64_t replay_rank_peak(const CostModel& model, const std::vector<StageProgram>& programs,
                         const std::vector<Action>& rank_actions) {
  std::vector<std::unique_ptr<detail::StageReplay>> replays;
  std::map<int, size_t> of_stage;
  int64_t peak = 0;
  for (const StageProgram& p : programs) {
    of_stage[p.stage] = replays.size();
    replays.push_back(std::make_unique<detail::StageReplay>(model, p.begin, p.end, p.stage, p.actions, nullptr));
  }
  detail::RankSends sends;
  sends.depth = static_cast<size_t>(model.schedule().traits().sends_in_flight);
  for (size_t k = 0; k < replays.size(); ++k) replays[k]->begin(programs[k].evictions, &peak, &sends);
  // Synchronous schedules: the second pass is the steady state (optimizer state allocated).
  const int passes = model.schedule().traits().drains_every_step ? 2 : 1;
  for (int pass = 0; pass < passes; ++pass)
    for (size_t i = 0; i < rank_actions.size(); ++i) {
      const Action& a = rank_actions[i];
      const auto found = of_stage.find(a.stage);
      if (found == of_stage.end()) continue;
      int64_t others = 0;
      for (size_t k = 0; k < replays.size(); ++k)
        if (k != found->second) others += replays[k]->live();
      replays[found->second]->step(a, static_cast<int>(i), others);
    }
  return peak;
}

StageMemoryReplay replay_whole_step(const Profile& profile, OptimizerKind optimizer) {
  PlanOptions one;
  one.stages = 1;
  one.schedule = ScheduleChoice::named("gpipe");
  one.micro_batches = 1;
  one.optimizer = optimizer;
  const CostModel model(profile, one);
  return replay_stage_memory(model, 0, model.size(), 0, {});
}

StageMemoryReplay replay_stage_memory(const CostModel& model, int b, int e, int x,
                                      const std::vector<TensorDecision>& decisions) {
  // The program stage_program() makes, without copying its actions (the planner asks often);
  // its REDUCE_TIED actions hold no memory, so the schedule's own list replays the same.
  return StageReplayer(model, b, e, x).replay(decisions);
}

}  // namespace dawnpiper
