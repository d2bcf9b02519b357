// Evicted tensors brought back before the backward reads them: swaps in, re-runs (plan/stage_replay.h).
#include "plan/stage_replay.h"

namespace dawnpiper {
namespace detail {

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

}  // namespace detail
}  // namespace dawnpiper
