#include "plan/stage_memory.h"

#include "plan/stage_replay.h"

namespace dawnpiper {

namespace detail {

int64_t sum_bytes(const std::vector<TensorBytes>& list) {
  int64_t s = 0;
  for (const TensorBytes& t : list) s += t.bytes;
  return s;
}

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
  place_zero_buckets(held_bytes);
  if (zero_gathers()) {
    // What each node reads: its own parameters, and a tied weight's owner or the copy here (held
    // by its last user in the stage).
    gather_reads_.assign(n_nodes, {});
    param_reads_.assign(n_nodes, {});
    next_reader_.assign(n_nodes, -1);
    next_param_reader_.assign(n_nodes, -1);
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
      param_reads_[at(n - b_)] = reads;
      std::sort(param_reads_[at(n - b_)].begin(), param_reads_[at(n - b_)].end());
      for (int t : model_.inputs(n))
        if (auto v = views.find(t); v != views.end()) reads.insert(reads.end(), v->second.begin(), v->second.end());
      std::sort(reads.begin(), reads.end());
      reads.erase(std::unique(reads.begin(), reads.end()), reads.end());
      for (int t : p_.nodes[at(n)].outputs)
        if (!reads.empty() && !model_.is_internal(t) && !model_.owns_storage()[at(t)]) views[t] = reads;
    }
    for (int n = e_ - 1, next = -1, next_param = -1; n >= b_; --n) {
      next_reader_[at(n - b_)] = next;
      next_param_reader_[at(n - b_)] = next_param;
      if (!gather_reads_[at(n - b_)].empty()) next = n;
      if (!param_reads_[at(n - b_)].empty()) next_param = n;
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
  for (const TensorBytes& r : received_) {
    if (!permuted(r.tensor) || r.bytes != bytes(model_.alias_roots()[at(r.tensor)])) continue;
    largest_relaid_input_ = std::max(largest_relaid_input_, r.bytes);
    if (requires_grad_[at(r.tensor)]) relaid_input_grad_bytes_ += r.bytes;
  }
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
    m.received_grads = m.input_grads = m.version = m.slices_until_input_end = 0;
    m.out.clear();
  }
  m.refs = refs_;
  m.alive.assign(static_cast<size_t>(locals_), 0);
  m.evicted.assign(static_cast<size_t>(locals_), 0);
  m.has_grad.assign(static_cast<size_t>(locals_), 0);
  m.permuted.assign(static_cast<size_t>(locals_), 0);
  m.grad_in_loss.assign(static_cast<size_t>(locals_), 0);
  m.grad_views.assign(static_cast<size_t>(locals_), 0);
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
  note(live_ + largest_relaid_input_, -1);
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
  note(live_ + relaid_input_grad_bytes_, -1);
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
