#include "runtime/evictor.h"

#include <ATen/SequenceNumber.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <set>
#include <stdexcept>
#include <unordered_set>

#include "util/error.h"

namespace dawnpiper {

namespace {

c10::StorageImpl* storage_of(const at::Tensor& t) { return t.storage().unsafeGetStorageImpl(); }

struct RestoreBeforeBackward : torch::autograd::FunctionPreHook {
  RestoreBeforeBackward(Evictor& evictor, int64_t mb, int node) : evictor(evictor), mb(mb), node(node) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    evictor.restore_for(mb, node);
    return grads;
  }
  Evictor& evictor;
  int64_t mb;
  int node;
};

}  // namespace

Evictor::Evictor(const StageModule& module, const std::vector<Eviction>& evictions)
    : module_(module), graph_(module.graph()), entries_(evictions) {
  const int b = module.begin(), e = module.end();
  const int tensors = static_cast<int>(graph_.tensors.size());
  auto in_stage = [&](int node) { return node >= b && node < e; };
  std::vector<char> is_leaf(static_cast<size_t>(tensors), 0);
  evict_after_.assign(static_cast<size_t>(e - b), {});
  leaves_of_node_.assign(static_cast<size_t>(e - b), {});
  pickup_after_.assign(static_cast<size_t>(e - b), {});
  const std::string stage = "stage nodes [" + std::to_string(b) + ", " + std::to_string(e) + ")";
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Eviction& ev = entries_[i];
    const int index = static_cast<int>(i);
    const bool internal = ev.internal.node >= 0;  // an autograd-internal buffer the module holds
    int slot = ev.tensor;
    if (internal) {
      slot = module.internal_slot(ev.internal.node, ev.internal.copy_of);
      if (slot < 0)
        throw ConfigError("plan evicts tensor " + std::to_string(ev.tensor) + ", an internal buffer of node " +
                          std::to_string(ev.internal.node) + " that " + stage + " does not hold");
    } else if (ev.tensor < 0 || ev.tensor >= tensors) {  // past the graph's: autograd-internal buffers
      throw ConfigError("plan evicts tensor " + std::to_string(ev.tensor) + ", which " + stage +
                        " cannot evict (not a tensor of the graph)");
    }
    const std::string name =
        internal ? graph_.nodes[ev.internal.node].name + ".internal" : graph_.tensor(ev.tensor).name;
    slot_.push_back(slot);
    producer_.push_back(internal ? ev.internal.node : graph_.tensor(ev.tensor).producer);
    name_.push_back(name);
    if ((ev.evict_after != -1 && !in_stage(ev.evict_after)) || !in_stage(ev.restore_before) ||
        !in_stage(ev.prefetch_at) || ev.action == TensorAction::Keep)
      throw ConfigError("plan evicts " + name + " at nodes outside " + stage + " (a program for another stage?)");
    for (int n : ev.rerun)
      if (!in_stage(n))
        throw ConfigError("plan recomputes " + name + " by re-running node " + std::to_string(n) + ", outside " +
                          stage);
    for (int t : ev.leaves) {
      if (t < 0 || t >= tensors) throw ConfigError("plan recomputes " + name + " from a tensor outside the graph");
      is_leaf[static_cast<size_t>(t)] = 1;
    }
    if (ev.action == TensorAction::Swap && !copier_) copier_ = std::make_unique<SwapCopier>(module.device());
    if (ev.evict_after < 0)
      sent_entries_.push_back(index);
    else
      evict_after_[static_cast<size_t>(ev.evict_after - b)].push_back(index);
    // Picked up where the tensor appears (the stage keeps a tensor in its env only until its
    // last direct reader; readers of its views come later).
    const int p = producer_.back();
    if (internal || (in_stage(p) && !graph_.is_data(ev.tensor)))
      pickup_after_[static_cast<size_t>(p - b)].push_back(index);
    else
      external_pickups_.push_back(index);
  }
  // Where the evictor picks up what recomputation reads: the stage's inputs at the forward's
  // start, the rest right after the node that produces it.
  for (int t = 0; t < tensors; ++t) {
    if (!is_leaf[static_cast<size_t>(t)]) continue;
    const int p = graph_.tensor(t).producer;
    if (in_stage(p) && !graph_.is_data(t))
      leaves_of_node_[static_cast<size_t>(p - b)].push_back(t);
    else
      external_leaves_.push_back(t);
  }
}

void Evictor::emit(ActionKind kind, int64_t mb, int tensor, int64_t bytes, Clock::time_point start) {
  if (listener_) listener_(kind, mb, tensor, bytes, start, Clock::now());
}

void Evictor::begin_forward(int64_t mb, const RunContext& ctx, const TensorEnv& env) {
  MicroBatch& m = mbs_[mb];
  m = MicroBatch{};
  m.ctx = ctx;
  m.node_seq.assign(static_cast<size_t>(module_.end() - module_.begin()), 0);
  for (int t : external_leaves_) m.leaves[t] = env.at(static_cast<size_t>(t));
  for (int i : external_pickups_) pick_up(m, i, env);
}

void Evictor::pick_up(MicroBatch& m, int i, const TensorEnv& env) {
  const at::Tensor& t = env[static_cast<size_t>(slot_[static_cast<size_t>(i)])];
  if (!t.defined())
    throw std::logic_error("evictor: tensor " + name_[static_cast<size_t>(i)] + " is not in the forward's env");
  Held& h = m.held[i];
  h.tensor = t.detach();
  h.bytes = static_cast<int64_t>(t.storage().nbytes());
}

void Evictor::before_node(int64_t mb, int node) {
  mbs_.at(mb).node_seq[static_cast<size_t>(node - module_.begin())] = at::sequence_number::peek();
}

void Evictor::after_node(int64_t mb, int node, TensorEnv& env) {
  MicroBatch& m = mbs_.at(mb);
  const size_t offset = static_cast<size_t>(node - module_.begin());
  for (int t : leaves_of_node_[offset]) m.leaves[t] = env[static_cast<size_t>(t)];
  for (int i : pickup_after_[offset]) pick_up(m, i, env);
  for (int i : evict_after_[offset])
    if (entries_[static_cast<size_t>(i)].evict_after >= 0) evict(m, i, m.held.at(i).tensor);
}

void Evictor::after_send(int64_t mb) {
  if (sent_entries_.empty()) return;
  MicroBatch& m = mbs_.at(mb);
  for (int i : sent_entries_) evict(m, i, m.held.at(i).tensor);
}

void Evictor::evict(MicroBatch& m, int i, const at::Tensor& tensor) {
  const Eviction& entry = entries_[static_cast<size_t>(i)];
  Held& h = m.held.at(i);
  c10::StorageImpl* storage = storage_of(tensor);
  if (h.evicted || h.bytes == 0) return;
  if (storage->data() == nullptr)  // the planner's storages differ from the stage's: a bug
    throw std::logic_error("evictor: " + name_[static_cast<size_t>(i)] +
                           " shares its storage with a tensor evicted before");
  const Clock::time_point start = Clock::now();
  c10::DataPtr data = storage->set_data_ptr(c10::DataPtr(nullptr, storage->device()));
  h.evicted = true;
  if (entry.action == TensorAction::Swap) {
    h.host = copier_->copy_out(std::move(data), h.bytes);
    emit(ActionKind::SwapOut, m.ctx.micro_batch, entry.tensor, h.bytes, start);
  }
}

void Evictor::start_swap_in(int64_t mb, MicroBatch& m, int i) {
  Held& h = m.held.at(i);
  if (h.arriving) return;
  const Clock::time_point start = Clock::now();
  h.incoming = copier_->copy_in(std::move(h.host), h.bytes);
  h.arriving = true;
  emit(ActionKind::SwapIn, mb, entries_[static_cast<size_t>(i)].tensor, h.bytes, start);
}

void Evictor::finish_swap_in(MicroBatch& m, int i) {
  Held& h = m.held.at(i);
  copier_->wait(h.incoming);
  storage_of(h.tensor)->set_data_ptr_noswap(std::move(h.incoming.data));
  h.incoming = {};
  h.arriving = false;
  h.evicted = false;
}

void Evictor::recompute(int64_t mb, MicroBatch& m, const std::vector<int>& targets) {
  const Clock::time_point start = Clock::now();
  std::set<int> nodes;
  for (int i : targets)
    nodes.insert(entries_[static_cast<size_t>(i)].rerun.begin(), entries_[static_cast<size_t>(i)].rerun.end());
  TensorEnv env = module_.make_env();
  std::set<int> reads;  // what the re-run reads that it does not make
  for (int n : nodes)
    for (int in : graph_.nodes[n].inputs) {
      if (nodes.count(graph_.tensor(in).producer) && !graph_.is_data(in)) continue;  // re-run too
      auto leaf = m.leaves.find(in);
      if (leaf == m.leaves.end())
        throw std::logic_error("evictor: recomputation input " + graph_.tensor(in).name + " was not held");
      env[static_cast<size_t>(in)] = leaf->second;
      reads.insert(in);
    }
  // Swapped inputs it reads come back early, in program order (the replay's order too).
  for (auto& [i, h] : m.held)
    if (h.evicted && entries_[static_cast<size_t>(i)].action == TensorAction::Swap &&
        reads.count(entries_[static_cast<size_t>(i)].tensor)) {
      start_swap_in(mb, m, i);
      finish_swap_in(m, i);
    }
  {
    // Grad mode as in the forward: some kernels choose their path by it (matmul folding).
    at::AutoGradMode grad(true);
    for (int n : nodes) module_.run_node(n, env, m.ctx);
  }
  // Install the rebuilt bytes into the evicted storages: every pending recomputation whose
  // producer re-ran (those of later restores too: the nodes re-run once are shared).
  int64_t bytes = 0;
  int first = -1;
  for (auto it = m.held.begin(); it != m.held.end(); ++it) {
    const Eviction& entry = entries_[static_cast<size_t>(it->first)];
    Held& h = it->second;
    const size_t k = static_cast<size_t>(it->first);
    if (entry.action != TensorAction::Recompute || !h.evicted || !nodes.count(producer_[k])) continue;
    const at::Tensor& rebuilt = env[static_cast<size_t>(slot_[k])];
    if (!rebuilt.defined() || static_cast<int64_t>(rebuilt.storage().nbytes()) != h.bytes ||
        rebuilt.sizes() != h.tensor.sizes() || rebuilt.strides() != h.tensor.strides() ||
        rebuilt.storage_offset() != h.tensor.storage_offset())
      throw std::logic_error("evictor: recomputed " + name_[k] + " does not have the evicted tensor's layout");
    c10::DataPtr data = storage_of(rebuilt)->set_data_ptr(c10::DataPtr(nullptr, rebuilt.device()));
    storage_of(h.tensor)->set_data_ptr_noswap(std::move(data));
    h.evicted = false;
    bytes += h.bytes;
    if (first < 0) first = entry.tensor;
  }
  env.clear();
  emit(ActionKind::Recompute, mb, first, bytes, start);
}

void Evictor::restore_for(int64_t mb, int node) {
  auto found = mbs_.find(mb);
  if (found == mbs_.end()) return;
  MicroBatch& m = found->second;
  std::vector<int> recomputes, copies_back;
  for (auto& [i, h] : m.held) {
    if (!h.evicted) continue;
    const Eviction& entry = entries_[static_cast<size_t>(i)];
    if (entry.action == TensorAction::Swap) {
      if (entry.prefetch_at >= node) copies_back.push_back(i);
    } else if (entry.restore_before >= node) {
      recomputes.push_back(i);
    }
  }
  // The copies back start at their prefetch nodes, on one stream in the order they are read
  // (the planner's place_prefetches queues them so); the storage gets each where it is read.
  std::stable_sort(copies_back.begin(), copies_back.end(), [&](int a, int c) {
    return entries_[static_cast<size_t>(a)].restore_before > entries_[static_cast<size_t>(c)].restore_before;
  });
  for (int i : copies_back) start_swap_in(mb, m, i);
  for (int i : copies_back)
    if (entries_[static_cast<size_t>(i)].restore_before >= node) finish_swap_in(m, i);
  if (!recomputes.empty()) recompute(mb, m, recomputes);
  // Forget what is back on the device; drop the inputs no pending recomputation reads (each
  // is held only until the last re-run that reads it, as the planner's memory replay assumes).
  std::set<int> still_read;
  for (auto it = m.held.begin(); it != m.held.end();) {
    if (!it->second.evicted) {
      it = m.held.erase(it);
      continue;
    }
    const Eviction& entry = entries_[static_cast<size_t>(it->first)];
    if (entry.action == TensorAction::Recompute) still_read.insert(entry.leaves.begin(), entry.leaves.end());
    ++it;
  }
  for (auto it = m.leaves.begin(); it != m.leaves.end();)
    it = still_read.count(it->first) ? std::next(it) : m.leaves.erase(it);
}

void Evictor::before_backward(int64_t mb, const std::vector<at::Tensor>& roots) {
  MicroBatch& m = mbs_.at(mb);
  std::vector<torch::autograd::Node*> stack;
  for (const at::Tensor& r : roots)
    if (r.grad_fn()) stack.push_back(r.grad_fn().get());
  std::unordered_set<torch::autograd::Node*> seen;
  while (!stack.empty()) {
    torch::autograd::Node* fn = stack.back();
    stack.pop_back();
    if (!fn || !seen.insert(fn).second) continue;
    for (const torch::autograd::Edge& edge : fn->next_edges()) stack.push_back(edge.function.get());
    const uint64_t seq = fn->sequence_nr();
    if (seq == std::numeric_limits<uint64_t>::max()) continue;  // AccumulateGrad
    const auto it = std::upper_bound(m.node_seq.begin(), m.node_seq.end(), seq);
    if (it == m.node_seq.begin()) continue;
    const int owner = module_.begin() + static_cast<int>(it - m.node_seq.begin()) - 1;
    fn->add_pre_hook(std::make_unique<RestoreBeforeBackward>(*this, mb, owner));
  }
}

void Evictor::after_backward(int64_t mb) { mbs_.erase(mb); }

}  // namespace dawnpiper
