// The stage replay's set-up (plan/stage_replay.h): what does not depend on the evictions, done
// once per stage: its storages and their references, the gradients autograd writes over or
// slices, the weights, the evictions' placement and the messages. The walk is in
// stage_memory.cpp, stage_replay_walk.cpp, stage_replay_restore.cpp and stage_replay_sharding.cpp.
#include <algorithm>
#include <set>

#include "plan/stage_replay.h"

namespace dawnpiper {
namespace detail {

namespace {
int64_t sum_bytes(const std::vector<TensorBytes>& list) {
  int64_t s = 0;
  for (const TensorBytes& t : list) s += t.bytes;
  return s;
}
}  // namespace

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
  find_concat_wholes();
  measure_messages();
}
void StageReplay::place_storages() {
  if (b_ > 0) received_ = model_.crossing(b_);
  if (e_ < model_.size()) sent_ = model_.crossing(e_);
  is_received_.assign(at(T_), 0);
  for (const TensorBytes& r : received_) is_received_[at(r.tensor)] = 1;
  // From the graph's owners, patched where a received tensor (a fresh copy) starts a storage of
  // its own: its views share it, and the copy the whole graph makes of it is not made (it arrives
  // contiguous), but where the stage lays it out again as a permuted view.
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
    if (!model_.relaid_on_receipt(r.tensor))
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
// copy is counted as a transient of the node reading it (concat_slice_gradient). Counted so for
// concats whose inputs are each read by the concat alone and made by a node of the stage (an LM
// head's chunks: the zoo's --output-chunks, an export's; AmoebaNet's cell outputs; a rotary
// embedding's halves) or received; other concats keep the
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
      // Made by a node whose backward reads t's gradient as its own output's (not another output)
      // and makes its input's gradient from it: a storage of its own, or a slice (Llama's and
      // GPT-NeoX's rotary halves).
      const bool made_here =
          tp.producer >= b_ && tp.producer < i &&
          (model_.owns_storage()[at(t)] || model_.node_class(tp.producer) == NodeClass::ViewAllocatingGradient) &&
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

// at::cat's backward hands out slices of one gradient, whatever the replay counts (see above),
// and an add hands a slice on to its inputs as it is: the whole lives until the last slice is
// let go, at the latest once the earliest node a slice reaches so has run its backward. Where a
// slice reaches a parameter reader's output, I captures it for W and the whole lives until I
// ends; there the runtime copies the regions W holds, unless they cover it
// (exec/split_backward.cpp). (AmoebaNet's cells: their sums pass slices to batch norms.)
void StageReplay::find_concat_wholes() {
  whole_held_in_input_.assign(static_cast<size_t>(e_ - b_), 0);
  whole_freed_after_.assign(static_cast<size_t>(e_ - b_), -1);
  std::vector<int> stack;
  for (int c = b_; c < e_; ++c) {
    if (model_.node_class(c) != NodeClass::Concat || model_.inputs(c).size() < 2) continue;
    std::vector<int> inputs = model_.inputs(c);
    int64_t input_bytes = 0;
    for (int t : inputs) input_bytes += bytes(t);
    std::sort(inputs.begin(), inputs.end());
    const bool distinct = std::adjacent_find(inputs.begin(), inputs.end()) == inputs.end();
    if (!distinct || input_bytes != bytes(model_.graph_output(c))) continue;  // (not one buffer in slices)
    int earliest = e_;
    bool passed = false;
    stack = inputs;
    while (!stack.empty()) {
      const int t = stack.back();
      stack.pop_back();
      const int producer = p_.tensors[at(t)].producer;
      if (!requires_grad_[at(t)] || !in_range(producer) || !model_.has_backward(producer)) continue;
      earliest = std::min(earliest, producer);
      if (reads_params_[at(producer - b_)]) {
        whole_held_in_input_[at(c - b_)] = 1;
      } else if (p_.nodes[at(producer)].passes_gradient) {
        passed = true;
        for (int u : model_.inputs(producer))
          if (bytes(u) == bytes(t)) stack.push_back(u);
      }
    }
    // A sliced concat's whole goes after its first input's producer (find_sliced_gradients)
    // unless an add hands a slice further on.
    if (earliest < e_ && (passed || !slices_gradient_[at(c - b_)])) whole_freed_after_[at(c - b_)] = earliest;
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
  if (zero_gathers()) place_gather_reads(tied_users);
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

// Level 3: the buckets each node needs gathered, and the next node that needs any.
void StageReplay::place_gather_reads(const std::map<int, std::vector<int>>& tied_users) {
  const size_t n_nodes = static_cast<size_t>(e_ - b_);
  // What each node reads: its own parameters, and a tied weight's owner or the copy here (held
  // by its last user in the stage).
  gather_reads_.assign(n_nodes, {});
  param_reads_.assign(n_nodes, {});
  next_reader_.assign(n_nodes, -1);
  next_param_reader_.assign(n_nodes, -1);
  previous_param_reader_.assign(n_nodes, -1);
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
  for (int n = b_, previous = -1; n < e_; ++n) {
    previous_param_reader_[at(n - b_)] = previous;
    if (!param_reads_[at(n - b_)].empty()) previous = n;
  }
  // (the runtime hooks each input a gathering node computes from that autograd tracks here)
  readers_of_output_.assign(n_nodes, {});
  for (int n = b_; n < e_; ++n) {
    if (gather_reads_[at(n - b_)].empty()) continue;
    for (int t : model_.inputs(n)) {
      const int producer = p_.tensors[at(t)].producer;
      if (!in_range(producer) || !requires_grad_[at(t)]) continue;
      std::vector<int>& readers = readers_of_output_[at(producer - b_)];
      if (std::find(readers.begin(), readers.end(), n) == readers.end()) readers.push_back(n);
    }
  }
  sent_view_from_.assign(zero_buckets_.size(), std::numeric_limits<int>::max());
  sent_param_views_.clear();
  for (const TensorBytes& s : sent_) {
    const auto v = views.find(s.tensor);
    if (v == views.end()) continue;
    sent_param_views_.push_back(s.tensor);
    for (int k : v->second)
      sent_view_from_[at(k)] = std::min(sent_view_from_[at(k)], p_.tensors[at(s.tensor)].producer);
  }
  gathered_.assign(zero_buckets_.size(), 0);
  gather_unmade_.assign(zero_buckets_.size(), 0);
  for (int k : zero_bucket_of_)
    if (k >= 0) ++gather_unmade_[at(k)];
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
  for (const TensorBytes& r : received_) {
    if (!model_.relaid_on_receipt(r.tensor)) continue;
    largest_relaid_input_ = std::max(largest_relaid_input_, r.bytes);
    if (requires_grad_[at(r.tensor)]) relaid_input_grad_bytes_ += r.bytes;
  }
  for (const TensorBytes& s : sent_) {
    if (model_.permuted(s.tensor)) {
      permuted_sent_bytes_ += s.bytes;
      // Its gradient arrives contiguous; the runtime gives it the tensor's layout where that is a
      // permutation of all of its storage (not of a slice: a fused projection's query).
      if (requires_grad_[at(s.tensor)] && s.bytes == bytes(key_[at(s.tensor)])) {
        relaid_grads_.insert(std::upper_bound(relaid_grads_.begin(), relaid_grads_.end(), s.tensor), s.tensor);
        largest_permuted_grad_ = std::max(largest_permuted_grad_, s.bytes);
      }
    } else {
      if (std::find(sent_param_views_.begin(), sent_param_views_.end(), s.tensor) != sent_param_views_.end())
        sent_param_view_copies_ += s.bytes;
      if (std::find(sent_originals_.begin(), sent_originals_.end(), key_[at(s.tensor)]) == sent_originals_.end())
        sent_originals_.push_back(key_[at(s.tensor)]);
    }
  }
}
}  // namespace detail
}  // namespace dawnpiper
