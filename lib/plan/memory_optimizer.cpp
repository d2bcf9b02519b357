#include "plan/memory_optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <queue>

#include "util/error.h"

namespace dawnpiper {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
enum TensorState { kNotSaved = 0, kKeep = 1, kSwap = 2, kRecompute = 3 };
}  // namespace

MemoryOptimizer::MemoryOptimizer(const CostModel& model, MemoptKind mode, int64_t capacity,
                                 MemoptGranularity granularity)
    : model_(model), mode_(mode), capacity_(capacity), granularity_(granularity) {
  size_t tensors = model.profile().tensors.size();
  size_t nodes = static_cast<size_t>(model.size());
  tensor_epoch_.assign(tensors, 0);
  tensor_state_.assign(tensors, kNotSaved);
  node_epoch_.assign(nodes, 0);
  visit_epoch_.assign(nodes, 0);
}

void MemoryOptimizer::gather(int b, int e, int x) {
  if (gathered_ == std::array<int, 3>{b, e, x}) {  // the same stage at another capacity
    for (int t : saved_) {
      tensor_epoch_[static_cast<size_t>(t)] = epoch_;
      tensor_state_[static_cast<size_t>(t)] = kKeep;
    }
    return;
  }
  gathered_ = {b, e, x};
  saved_.clear();
  for (int node = b; node < e; ++node)
    for (int t : model_.saved_at(node)) saved_.push_back(t);
  std::sort(saved_.begin(), saved_.end());
  saved_.erase(std::unique(saved_.begin(), saved_.end()), saved_.end());
  candidates_.clear();
  unit_members_.clear();
  unit_recompute_ms_.clear();
  const Profile& profile = model_.profile();
  auto block_of = [&](int node) { return profile.nodes[static_cast<size_t>(node)].block; };
  std::map<int, int> unit_of_block;
  for (int node = b; node < e; ++node) {
    for (int t : model_.saved_at(node)) {
      if (tensor_epoch_[static_cast<size_t>(t)] == epoch_) continue;
      tensor_epoch_[static_cast<size_t>(t)] = epoch_;
      tensor_state_[static_cast<size_t>(t)] = kKeep;
      const int p = model_.producer(t);
      const bool in_stage = p >= b && p < e && !model_.is_data(t);
      const bool sent_on = model_.last_consumer(t) >= e;
      const std::vector<int>& savers = model_.saved_by(t);
      const int first_bwd = *(std::lower_bound(savers.begin(), savers.end(), e) - 1);
      int last_fwd = std::max(first_bwd, in_stage ? p : b);
      for (int c : profile.tensors[static_cast<size_t>(t)].consumers)
        if (c < e) last_fwd = std::max(last_fwd, c);
      const int64_t bytes = model_.tensor_bytes(t);
      if (!model_.evictable(t)) continue;  // stays, counted in the activations
      if (model_.copy_not_made(t, b)) continue;
      if (granularity_ == MemoptGranularity::Tensor) {
        candidates_.push_back({t, bytes, last_fwd, first_bwd, sent_on, in_stage});
        continue;
      }
      // Block granularity: only tensors produced and read inside one block of this stage.
      if (in_stage && !sent_on) add_to_block_unit(unit_of_block, {t, bytes, last_fwd, first_bwd, false, true}, b, e);
    }
  }
  if (granularity_ == MemoptGranularity::Block) {
    unit_recompute_ms_.assign(candidates_.size(), 0);
    for (int node = b; node < e; ++node) {
      auto found = unit_of_block.find(block_of(node));
      if (found != unit_of_block.end())
        unit_recompute_ms_[static_cast<size_t>(found->second)] += model_.recompute_ms(node);
    }
  }
  time_candidates(b, e, x);
}

// Adds tensor c.tensor to its block's unit when the block (inside this stage) alone produces,
// reads and saves it.
void MemoryOptimizer::add_to_block_unit(std::map<int, int>& unit_of_block, const Candidate& c, int b, int e) {
  const Profile& profile = model_.profile();
  auto block_of = [&](int node) { return profile.nodes[static_cast<size_t>(node)].block; };
  const int block = block_of(model_.producer(c.tensor));
  bool internal = true;
  for (int r : profile.tensors[static_cast<size_t>(c.tensor)].consumers) internal = internal && block_of(r) == block;
  for (int s : model_.saved_by(c.tensor)) internal = internal && s >= b && s < e && block_of(s) == block;
  if (!internal) return;
  auto found = unit_of_block.find(block);
  if (found == unit_of_block.end()) {
    found = unit_of_block.emplace(block, static_cast<int>(candidates_.size())).first;
    candidates_.push_back({-1, 0, c.last_fwd, c.first_bwd, false, true});
    unit_members_.emplace_back();
  }
  Candidate& unit = candidates_[static_cast<size_t>(found->second)];
  unit.bytes += c.bytes;
  unit.last_fwd = std::max(unit.last_fwd, c.last_fwd);
  unit.first_bwd = std::max(unit.first_bwd, c.first_bwd);
  unit_members_[static_cast<size_t>(found->second)].push_back(c.tensor);
}

// Each candidate's swap time and the time it could hide in, and the order of those that hide.
void MemoryOptimizer::time_candidates(int b, int e, int x) {
  // Idle from the last forward use to the first backward use: the rest of this forward, the
  // passes the schedule runs in between (the shortest such gap), the backward of later nodes.
  const double tf = model_.fwd_ms(b, e), tb = model_.bwd_ms(b, e);
  const double gap = model_.stage_stats(x).min_gap_ms(tf, tb);
  for (Candidate& c : candidates_) {
    double fwd_end = c.sent_on ? tf : model_.fwd_ms(b, c.last_fwd + 1);
    double idle = (tf - fwd_end) + gap + model_.bwd_ms(c.first_bwd + 1, e);
    c.swap_ms = model_.host_ms(c.bytes);
    c.free_ms = idle - 2 * c.swap_ms;
  }
  // The swaps whose copies hide in their idle time, the longest idle first (ties: in order).
  free_order_.clear();
  for (size_t i = 0; i < candidates_.size(); ++i)
    if (candidates_[i].free_ms > 0) free_order_.push_back(i);
  std::sort(free_order_.begin(), free_order_.end(), [&](size_t a, size_t c) {
    if (candidates_[a].free_ms != candidates_[c].free_ms) return candidates_[a].free_ms > candidates_[c].free_ms;
    return a < c;
  });
}

namespace {
// Latest starts of copies back (ms from the start of the stage's backward; node n's backward
// starts at bwd_ms(n + 1, e)), given read first first: each ends before the backward of the node
// that reads it and before the copy queued after it starts.
template <class Copy>
std::vector<double> latest_starts(const CostModel& model, int e, const std::vector<Copy>& copies) {
  std::vector<double> start(copies.size());
  double next = std::numeric_limits<double>::infinity();
  for (size_t k = copies.size(); k-- > 0;) {
    start[k] = std::min(model.bwd_ms(copies[k].restore_before + 1, e), next) - model.host_ms(copies[k].bytes);
    next = start[k];
  }
  return start;
}

struct CopyBack {
  int restore_before;
  int64_t bytes;
};
}  // namespace

void place_prefetches(const CostModel& model, int e, std::vector<TensorDecision>& decisions) {
  std::vector<TensorDecision*> swaps;
  for (TensorDecision& d : decisions)
    if (d.action == TensorAction::Swap) swaps.push_back(&d);
  // Needed first (the backward runs from the last node down), first on the stream.
  std::stable_sort(swaps.begin(), swaps.end(), [](const TensorDecision* a, const TensorDecision* c) {
    return a->restore_before > c->restore_before;
  });
  std::vector<CopyBack> copies;
  for (const TensorDecision* d : swaps) copies.push_back({d->restore_before, d->bytes});
  const std::vector<double> start = latest_starts(model, e, copies);
  for (size_t k = 0; k < swaps.size(); ++k) {
    // The latest node whose backward starts by then; the stage's first (e - 1) where none does
    // (the copy then delays the backward: queued_copy_stall).
    TensorDecision& d = *swaps[k];
    d.prefetch_at = d.restore_before;
    while (d.prefetch_at + 1 < e && model.bwd_ms(d.prefetch_at + 1, e) > start[k]) ++d.prefetch_at;
  }
}

double queued_copy_stall(const CostModel& model, int e, const std::vector<TensorDecision>& decisions) {
  std::vector<CopyBack> copies;
  for (const TensorDecision& d : decisions)
    if (d.action == TensorAction::Swap) copies.push_back({d.restore_before, d.bytes});
  if (copies.empty()) return 0;
  std::stable_sort(copies.begin(), copies.end(),
                   [](const CopyBack& a, const CopyBack& c) { return a.restore_before > c.restore_before; });
  // The first copy back can start no earlier than the stage's backward: what the queue needs
  // before that, the backward waits.
  return std::max(0.0, -latest_starts(model, e, copies).front());
}

double MemoryOptimizer::queued_copy_stall(int e) const {
  std::vector<TensorDecision> swaps;
  for (int t : saved_) {
    if (tensor_state_[static_cast<size_t>(t)] != kSwap) continue;
    const std::vector<int>& savers = model_.saved_by(t);
    const int restore_before = *(std::lower_bound(savers.begin(), savers.end(), e) - 1);
    swaps.push_back(TensorDecision{t, model_.tensor_bytes(t), TensorAction::Swap, restore_before});
  }
  return dawnpiper::queued_copy_stall(model_, e, swaps);
}

bool MemoryOptimizer::available_in_backward(int t, int b, int e) const {
  if (model_.is_data(t)) return true;  // every stage loads its data itself
  if (tensor_epoch_[static_cast<size_t>(t)] == epoch_) {
    int state = tensor_state_[static_cast<size_t>(t)];
    if (state == kKeep || state == kSwap) return true;
  }
  int p = model_.producer(t);
  return p >= b && p < e && node_epoch_[static_cast<size_t>(p)] == rerun_;  // re-run already
}

double MemoryOptimizer::marginal_recompute_ms(int i, int b, int e) {
  const Candidate& c = candidates_[static_cast<size_t>(i)];
  if (!c.recomputable) return kInf;
  if (granularity_ == MemoptGranularity::Block) return unit_recompute_ms_[static_cast<size_t>(i)];
  // Nodes that would have to re-run, beyond those already re-running: the producer, and the
  // producers of its inputs that are not on the device in backward, recursively.
  ++visit_;
  double cost = 0;
  std::vector<int> stack{model_.producer(c.tensor)};
  while (!stack.empty()) {
    int node = stack.back();
    stack.pop_back();
    if (node_epoch_[static_cast<size_t>(node)] == rerun_ || visit_epoch_[static_cast<size_t>(node)] == visit_) continue;
    visit_epoch_[static_cast<size_t>(node)] = visit_;
    cost += model_.recompute_ms(node);
    for (int in : model_.inputs(node)) {
      if (available_in_backward(in, b, e)) continue;
      int q = model_.producer(in);
      if (q < b || q >= e) return kInf;  // an input from another stage that is not kept
      stack.push_back(q);
    }
  }
  return cost;
}

void MemoryOptimizer::commit_recompute(int i, int b, int e) {
  const Candidate& c = candidates_[static_cast<size_t>(i)];
  if (granularity_ == MemoptGranularity::Block) {
    recompute_total_ms_ += unit_recompute_ms_[static_cast<size_t>(i)];
    return;
  }
  tensor_state_[static_cast<size_t>(c.tensor)] = kRecompute;
  std::vector<int> stack{model_.producer(c.tensor)};
  while (!stack.empty()) {
    int node = stack.back();
    stack.pop_back();
    if (node_epoch_[static_cast<size_t>(node)] == rerun_) continue;
    node_epoch_[static_cast<size_t>(node)] = rerun_;
    recompute_total_ms_ += model_.recompute_ms(node);
    for (int in : model_.inputs(node))
      if (!available_in_backward(in, b, e)) stack.push_back(model_.producer(in));
  }
}

void MemoryOptimizer::rebuild_recompute(int b, int e, const std::vector<char>& decided) {
  ++rerun_;
  recompute_total_ms_ = 0;
  for (size_t i = 0; i < candidates_.size(); ++i)
    if (decided[i] == 2) commit_recompute(static_cast<int>(i), b, e);
}

void MemoryOptimizer::take_swap(Selection& s, size_t i, double overhead) {
  s.decided[i] = 1;
  s.paid[i] = overhead;
  s.need -= s.k * candidates_[i].bytes;
  s.link_left -= 2 * candidates_[i].swap_ms;
  s.swap_overhead += overhead;
}

void MemoryOptimizer::take_recompute(Selection& s, size_t i, double cost, int b, int e) {
  s.decided[i] = 2;
  s.paid[i] = cost;
  s.need -= s.k * candidates_[i].bytes;
  commit_recompute(static_cast<int>(i), b, e);
}

// The stall a swap adds: its own (negative FreeTime) plus what overflows the host link.
double MemoryOptimizer::swap_overhead_of(const Selection& s, size_t i) const {
  const Candidate& c = candidates_[i];
  return std::max(0.0, -c.free_ms) + std::max(0.0, 2 * c.swap_ms - std::max(0.0, s.link_left));
}

// Phase 1: swaps that hide behind compute, largest FreeTime first, while the link has room.
void MemoryOptimizer::take_free_swaps(Selection& s) {
  for (size_t i : free_order_) {
    if (s.need <= 0) break;
    if (2 * candidates_[i].swap_ms <= s.link_left) take_swap(s, i, 0);
  }
}

// Phase 2: the option saving the most memory per millisecond of added time, until enough is
// saved; the last step takes the cheapest single candidate that covers what is left.
void MemoryOptimizer::take_cheapest(Selection& s, int b, int e) {
  const bool swaps = mode_ == MemoptKind::SwapRecompute;
  const size_t count = candidates_.size();
  auto saving = [&](size_t i) { return s.k * candidates_[i].bytes; };
  using Entry = std::pair<double, size_t>;  // (bytes saved per ms, candidate)
  std::priority_queue<Entry> swap_heap, recompute_heap;
  auto ratio = [&](size_t i, double cost) { return cost <= 0 ? kInf : static_cast<double>(saving(i)) / cost; };
  for (size_t i = 0; i < count; ++i) {
    if (s.decided[i]) continue;
    if (swaps) swap_heap.push({ratio(i, swap_overhead_of(s, i)), i});
    if (candidates_[i].recomputable) {
      double cost = marginal_recompute_ms(static_cast<int>(i), b, e);
      if (cost < kInf) recompute_heap.push({ratio(i, cost), i});
    }
  }
  // Takes the best current entry off a heap. Keys go stale towards worse (the link fills up,
  // inputs get evicted) or, for recompute, better (nodes already re-running are shared); a
  // popped entry whose fresh key is no longer the best goes back and the next is tried.
  auto pop_best = [&](std::priority_queue<Entry>& heap, bool is_swap, size_t& index, double& cost) -> bool {
    while (!heap.empty()) {
      Entry top = heap.top();
      heap.pop();
      if (s.decided[top.second]) continue;
      cost = is_swap ? swap_overhead_of(s, top.second) : marginal_recompute_ms(static_cast<int>(top.second), b, e);
      if (cost == kInf) continue;  // an input it needs is no longer on the device
      double r = ratio(top.second, cost);
      if (r < top.first && !heap.empty() && r < heap.top().first) {
        heap.push({r, top.second});
        continue;
      }
      index = top.second;
      return true;
    }
    return false;
  };
  while (s.need > 0) {
    size_t swap_i = 0, recompute_i = 0;
    double swap_cost = 0, recompute_cost = 0;
    bool has_swap = swaps && pop_best(swap_heap, true, swap_i, swap_cost);
    bool has_recompute = pop_best(recompute_heap, false, recompute_i, recompute_cost);
    if (!has_swap && !has_recompute) break;
    bool pick_swap = has_swap && (!has_recompute || ratio(swap_i, swap_cost) >= ratio(recompute_i, recompute_cost));
    size_t pick = pick_swap ? swap_i : recompute_i;
    double pick_cost = pick_swap ? swap_cost : recompute_cost;
    if (saving(pick) >= s.need) {
      // The last step: a single candidate that covers what is left at a lower absolute cost
      // beats the best ratio (which may save far more than needed).
      for (size_t i = 0; i < count; ++i) {
        if (s.decided[i] || saving(i) < s.need) continue;
        if (swaps) {
          double c = swap_overhead_of(s, i);
          if (c < pick_cost) pick = i, pick_cost = c, pick_swap = true;
        }
        if (candidates_[i].recomputable) {
          double c = marginal_recompute_ms(static_cast<int>(i), b, e);
          if (c < pick_cost) pick = i, pick_cost = c, pick_swap = false;
        }
      }
      if (pick_swap)
        take_swap(s, pick, pick_cost);
      else
        take_recompute(s, pick, pick_cost, b, e);
      break;
    }
    if (pick_swap) {
      take_swap(s, swap_i, swap_cost);
      if (has_recompute) recompute_heap.push({ratio(recompute_i, recompute_cost), recompute_i});
    } else {
      take_recompute(s, recompute_i, recompute_cost, b, e);
      if (has_swap) swap_heap.push({ratio(swap_i, swap_cost), swap_i});
    }
  }
}

// Phase 3: gives back the costliest evictions that are no longer needed.
void MemoryOptimizer::trim(Selection& s, int b, int e) {
  std::vector<size_t> taken;
  for (size_t i = 0; i < candidates_.size(); ++i)
    if (s.decided[i] && s.paid[i] > 0) taken.push_back(i);
  std::sort(taken.begin(), taken.end(), [&](size_t a, size_t c) { return s.paid[a] > s.paid[c]; });
  bool recompute_changed = false;
  for (size_t i : taken) {
    const int64_t saving = s.k * candidates_[i].bytes;
    if (s.need + saving > 0) continue;
    s.need += saving;
    if (s.decided[i] == 1) {
      s.swap_overhead -= s.paid[i];
      s.link_left += 2 * candidates_[i].swap_ms;
    } else {
      if (granularity_ == MemoptGranularity::Tensor) tensor_state_[static_cast<size_t>(candidates_[i].tensor)] = kKeep;
      recompute_changed = true;
    }
    s.decided[i] = 0;
  }
  if (recompute_changed) rebuild_recompute(b, e, s.decided);
}

void MemoryOptimizer::greedy(int b, int e, int x, int64_t need, StageMemopt& out) {
  Selection s;
  s.k = std::max(1, model_.in_flight(x));
  s.need = need;
  s.decided.assign(candidates_.size(), 0);
  s.paid.assign(candidates_.size(), 0);
  s.link_left = model_.compute_ms(b, e);
  ++rerun_;
  recompute_total_ms_ = 0;
  if (mode_ == MemoptKind::SwapRecompute) take_free_swaps(s);
  if (s.need > 0) take_cheapest(s, b, e);
  if (s.need <= 0) trim(s, b, e);

  out.feasible = s.need <= 0;
  out.overhead_ms = std::max(0.0, s.swap_overhead) + recompute_total_ms_;
  int64_t evicted = 0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    if (!s.decided[i]) continue;
    evicted += candidates_[i].bytes;
    if (s.decided[i] == 1)
      ++out.swapped;
    else
      ++out.recomputed;
    // Record the decision on every member tensor (for the output below).
    auto mark = [&](int t) { tensor_state_[static_cast<size_t>(t)] = s.decided[i] == 1 ? kSwap : kRecompute; };
    if (granularity_ == MemoptGranularity::Block)
      for (int t : unit_members_[i]) mark(t);
    else
      mark(candidates_[i].tensor);
  }
  out.activation_per_micro_batch -= evicted;
  out.peak = out.peak_before - s.k * evicted;
}

StageMemopt MemoryOptimizer::optimize(int b, int e, int x, bool with_decisions) {
  StageMemopt out;
  out.peak_before = model_.peak_without_memopt(b, e, x);
  out.peak = out.peak_before;
  out.activation_per_micro_batch = model_.activation_bytes(b, e);
  const int64_t need = out.peak_before - capacity_;
  if (!with_decisions && (need <= 0 || mode_ == MemoptKind::None)) {
    out.feasible = need <= 0;
    return out;
  }
  ++epoch_;
  gather(b, e, x);
  if (need <= 0) {
    out.feasible = true;
  } else if (mode_ == MemoptKind::None) {
    out.feasible = false;
  } else {
    greedy(b, e, x, need, out);
    // Copies back queue on one stream in the backward; where they cannot all end in time, the
    // backward waits (the swaps' own FreeTime covers each copy alone).
    if (out.swapped > 0) out.overhead_ms += queued_copy_stall(e);
  }
  if (with_decisions) {
    for (int t : saved_) {
      int state = tensor_state_[static_cast<size_t>(t)];
      TensorAction action = state == kSwap        ? TensorAction::Swap
                            : state == kRecompute ? TensorAction::Recompute
                                                  : TensorAction::Keep;
      const std::vector<int>& savers = model_.saved_by(t);
      const int restore_before = *(std::lower_bound(savers.begin(), savers.end(), e) - 1);
      out.decisions.push_back(TensorDecision{t, model_.tensor_bytes(t), action, restore_before});
    }
    place_prefetches(model_, e, out.decisions);
  }
  return out;
}

}  // namespace dawnpiper
