// The stage replay (plan/stage_replay.h) action by action, and the replays the planner calls.
#include "plan/stage_memory.h"

#include "plan/stage_replay.h"

namespace dawnpiper {

namespace detail {

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
  m.grad_owner.assign(static_cast<size_t>(locals_), -1);
  m.grad_holders.assign(static_cast<size_t>(locals_), 0);
  m.grad_sent.assign(static_cast<size_t>(locals_), 0);
  m.send_held_freed = 0;
  m.held_for_weights.assign(static_cast<size_t>(e_ - b_), -1);
  m.wholes_due.assign(static_cast<size_t>(e_ - b_), 0);
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
void StageReplay::send(int64_t held_by_send, int64_t originals_of, int64_t gradients_of) {
  if (segment_ == 0) segment_ = 1;
  RankSends& rank = sends();
  while (rank.order.size() >= rank.depth) {
    rank.order.front()->complete_oldest_send();
    rank.order.pop_front();
  }
  rank.order.push_back(this);
  pending_sends_.push_back({held_by_send, originals_of, gradients_of});
}

// W let go of gradient buffers a send of the micro-batch's input gradients also holds: still
// under way, the send holds their bytes until it completes; done, they go now.
void StageReplay::settle_sent_gradients(int64_t mb, MicroBatch& m) {
  if (m.send_held_freed == 0) return;
  auto sending = std::find_if(pending_sends_.begin(), pending_sends_.end(),
                              [&](const PendingSend& p) { return p.gradients_of == mb; });
  if (sending != pending_sends_.end())
    sending->bytes += m.send_held_freed;
  else
    live_ -= m.send_held_freed;
  m.send_held_freed = 0;
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
  weight_passes_ = 0;
  std::fill(avg_packed_.begin(), avg_packed_.end(), 0);
  losses_held_ = held_loss_bytes_ = 0;
  optimizer_state_ = backward_in_step_ = false;
  std::fill(zero_chunk_held_.begin(), zero_chunk_held_.end(), 0);
  zero_travelling_.clear();
  avg_armed_ = zero_armed_ = false;
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
  // A gradient I handed a received input as one buffer with other holders (input_gradients):
  // the send holds it, as the last holder in place of the buffer's bytes; else one holder more,
  // whose bytes the others count until the last of them (settle_sent_gradients).
  int64_t held_by_others = 0;
  for (const TensorBytes& t : received_) {
    const int owner = m.grad_owner[loc(t.tensor)];
    if (owner < 0) continue;
    if (gradient_shared(m, t.tensor)) held_by_others += t.bytes, m.grad_sent[loc(owner)] = 1;
    live_ += t.bytes - gradient_released(m, t.tensor);
  }
  live_ -= held_by_others + m.send_held_freed;  // (the last holders here: the send's bytes now)
  m.send_held_freed = 0;
  send(received_grad_bytes_ - held_by_others, std::numeric_limits<int64_t>::min(), a.micro_batch);
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
  // Level 3 sends the views of parameters as copies too (ZeroShard::views_gathered).
  const int64_t copies = evict_after_send_.empty() ? permuted_sent_bytes_ + sent_param_view_copies_ : sent_bytes_;
  live_ += copies;
  send(copies, evict_after_send_.empty() ? mb : std::numeric_limits<int64_t>::min());
  if (zero_gathers()) sent_views_copied();
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
  settle_sent_gradients(a.micro_batch, m);
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
