#include "plan/stage_memory.h"

#include <algorithm>
#include <map>
#include <set>

namespace dawnpiper {

namespace {

struct Eviction {
  int key = -1;
  int producer = -1;  // of the decided tensor
  bool recompute = false;
  int evict_after = -1;  // node; -1: after the micro-batch's activations are sent
  int restore_before = -1;
  std::vector<int> rerun;   // recompute: nodes re-run, with their outputs held together
  std::vector<int> leaves;  // recompute: storages the re-run reads, held until it ran
};

// One micro-batch's state on the stage between its forward and the end of its backward.
struct MicroBatch {
  std::vector<int> refs;
  std::vector<char> alive, evicted;
  // Gradients: 0 none yet, 1 allocated by this backward (freed once consumed), 2 a received
  // gradient (or a view of one) the stage holds until its backward ends.
  std::vector<char> has_grad;
  std::vector<char> permuted;  // the gradient is a transposed view: reshaping it copies
  int64_t received_grads = 0;  // gradients received for the backward
  int64_t input_grads = 0;     // gradients of received activations, until they are sent back
  int64_t version = 0;
};

}  // namespace

StageMemoryReplay replay_stage_memory(const CostModel& model, int b, int e, int x,
                                      const std::vector<TensorDecision>& decisions) {
  const Profile& p = model.profile();
  const int T = static_cast<int>(p.tensors.size());
  auto bytes = [&](int t) { return p.tensors[static_cast<size_t>(t)].bytes; };
  auto in_range = [&](int node) { return node >= b && node < e; };

  // Storages: a received activation is a fresh copy; anything else lives in the storage of
  // its alias chain's owner. Views of parameters allocate nothing.
  const std::vector<TensorBytes> received = b > 0 ? model.crossing(b) : std::vector<TensorBytes>{};
  const std::vector<TensorBytes> sent = e < model.size() ? model.crossing(e) : std::vector<TensorBytes>{};
  std::vector<char> is_received(static_cast<size_t>(T), 0);
  for (const TensorBytes& r : received) is_received[static_cast<size_t>(r.tensor)] = 1;
  std::vector<int> key(static_cast<size_t>(T));
  std::vector<char> storage(static_cast<size_t>(T), 0);
  for (int t = 0; t < T; ++t) {
    int k = t;
    while (!is_received[static_cast<size_t>(k)] && p.tensors[static_cast<size_t>(k)].alias_of >= 0)
      k = p.tensors[static_cast<size_t>(k)].alias_of;
    key[static_cast<size_t>(t)] = k;
    // A received operand arrives contiguous: the copy the whole graph makes of it is not made.
    const int copy_of = p.tensors[static_cast<size_t>(t)].copy_of;
    storage[static_cast<size_t>(t)] =
        (is_received[static_cast<size_t>(t)] || p.tensors[static_cast<size_t>(t)].owns_storage()) &&
        !(copy_of >= 0 && is_received[static_cast<size_t>(copy_of)]);
  }
  // Received views: the stage's savers of the sender-side owner save the received copy.
  std::map<int, std::vector<int>> received_of_owner;
  for (const TensorBytes& r : received) {
    int o = r.tensor;
    while (p.tensors[static_cast<size_t>(o)].alias_of >= 0) o = p.tensors[static_cast<size_t>(o)].alias_of;
    if (o != r.tensor && !is_received[static_cast<size_t>(o)]) received_of_owner[o].push_back(r.tensor);
  }
  auto saver_keys = [&](int t) -> std::vector<int> {
    auto found = received_of_owner.find(t);
    if (found != received_of_owner.end()) return found->second;
    return {key[static_cast<size_t>(t)]};
  };

  const std::vector<char>& requires_grad = model.requires_grad();

  // Forward references of each storage: readers in the range, savers in the range.
  std::vector<int> refs(static_cast<size_t>(T), 0);
  for (int n = b; n < e; ++n)
    for (int t : model.inputs(n)) ++refs[static_cast<size_t>(key[static_cast<size_t>(t)])];
  for (int n = b; n < e; ++n)
    for (int t : p.nodes[static_cast<size_t>(n)].saved)
      for (int k : saver_keys(t)) ++refs[static_cast<size_t>(k)];
  for (const TensorBytes& s : sent) ++refs[static_cast<size_t>(key[static_cast<size_t>(s.tensor)])];  // until backward
  for (const TensorBytes& r : received) ++refs[static_cast<size_t>(r.tensor)];  // until the gradient is sent
  std::vector<int> data, data_read_later;
  for (const TensorProfile& t : p.tensors) {
    if (!t.is_data) continue;
    bool read_here = false, read_later = false;
    for (int c : t.consumers) read_here |= in_range(c), read_later |= c >= e;
    if (!read_here) continue;
    data.push_back(t.id);
    if (read_later) data_read_later.push_back(t.id), ++refs[static_cast<size_t>(t.id)];  // until the forward ends
  }
  const bool last = e == model.size();
  const int loss = last ? p.nodes.back().outputs[0] : -1;
  if (last) ++refs[static_cast<size_t>(loss)];  // read by the backward

  // Parameters held, and where in the backward each one's gradient appears.
  int64_t weights = 0;
  std::vector<int64_t> grad_at(static_cast<size_t>(e - b), 0);
  std::set<int> tied_outside;
  std::map<int, std::vector<int>> tied_users;  // owner -> users in the stage, last first
  for (int n = e - 1; n >= b; --n) {
    const NodeProfile& node = p.nodes[static_cast<size_t>(n)];
    weights += node.param_bytes;
    grad_at[static_cast<size_t>(n - b)] += node.param_bytes;
    if (node.tied_owner < 0) continue;
    tied_users[node.tied_owner].push_back(n);
    if (in_range(node.tied_owner)) {  // one gradient, first created by the later user
      grad_at[static_cast<size_t>(n - b)] += node.tied_bytes;
      grad_at[static_cast<size_t>(node.tied_owner - b)] -= node.tied_bytes;
    } else if (tied_outside.insert(node.tied_owner).second) {  // a copy held here
      weights += node.tied_bytes;
      grad_at[static_cast<size_t>(n - b)] += node.tied_bytes;
    }
  }
  // Once the gradient exists (later micro-batches of a step), autograd sums the contributions
  // of a weight used by several nodes in a buffer before accumulating it: the buffer is filled
  // by the first of them in the backward and held until the last.
  std::vector<int64_t> hold_from(static_cast<size_t>(e - b), 0), hold_to(static_cast<size_t>(e - b), 0);
  for (auto& [owner, users] : tied_users) {
    if (in_range(owner)) users.push_back(owner);
    if (users.size() < 2) continue;
    const int64_t tied = p.nodes[static_cast<size_t>(users.front())].tied_bytes;
    hold_from[static_cast<size_t>(users.front() - b)] += tied;
    hold_to[static_cast<size_t>(users.back() - b)] += tied;
  }

  // The decisions, placed where the evictor carries them out.
  std::vector<int> action(static_cast<size_t>(T), -1);
  for (const TensorDecision& d : decisions)
    if (d.tensor >= 0 && d.tensor < T) action[static_cast<size_t>(d.tensor)] = static_cast<int>(d.action);
  auto available = [&](int t) {
    const int a = action[static_cast<size_t>(t)];
    return p.tensors[static_cast<size_t>(t)].is_data || p.tensors[static_cast<size_t>(t)].producer < b ||
           a == static_cast<int>(TensorAction::Keep) || a == static_cast<int>(TensorAction::Swap);
  };
  // The tensors sharing each decided tensor's storage, from one pass over the tensors.
  std::map<int, std::vector<int>> sharing;  // storage key -> tensors
  for (const TensorDecision& d : decisions)
    if (d.action != TensorAction::Keep && d.tensor >= 0 && d.tensor < T) sharing[key[static_cast<size_t>(d.tensor)]];
  if (!sharing.empty())
    for (int t = 0; t < T; ++t) {
      auto found = sharing.find(key[static_cast<size_t>(t)]);
      if (found != sharing.end()) found->second.push_back(t);
    }
  std::vector<Eviction> evictions;
  std::vector<std::vector<int>> evict_after(static_cast<size_t>(e - b));
  std::vector<int> evict_after_send;
  for (const TensorDecision& d : decisions) {
    if (d.action == TensorAction::Keep || d.tensor < 0 || d.tensor >= T ||
        p.tensors[static_cast<size_t>(d.tensor)].internal)
      continue;
    Eviction ev;
    ev.key = key[static_cast<size_t>(d.tensor)];
    ev.producer = p.tensors[static_cast<size_t>(d.tensor)].producer;
    ev.recompute = d.action == TensorAction::Recompute;
    int last_local = in_range(p.tensors[static_cast<size_t>(d.tensor)].producer)
                         ? p.tensors[static_cast<size_t>(d.tensor)].producer
                         : -1;
    bool read_later = false;
    for (int shared : sharing[ev.key]) {
      const TensorProfile& t = p.tensors[static_cast<size_t>(shared)];
      for (int c : t.consumers) {
        if (in_range(c)) last_local = std::max(last_local, c);
        read_later |= c >= e;
      }
    }
    if (last_local < 0) continue;
    const bool is_sent = read_later && !p.tensors[static_cast<size_t>(d.tensor)].is_data;
    ev.evict_after = is_sent ? -1 : last_local;
    ev.restore_before = in_range(d.restore_before) ? d.restore_before : last_local;
    // A swap is back from its prefetch on (the evictor starts the copy there).
    if (!ev.recompute && in_range(d.prefetch_at)) ev.restore_before = std::max(ev.restore_before, d.prefetch_at);
    if (ev.recompute) {
      std::set<int> rerun;
      std::vector<int> stack{p.tensors[static_cast<size_t>(d.tensor)].producer};
      while (!stack.empty()) {
        const int n = stack.back();
        stack.pop_back();
        if (!in_range(n) || !rerun.insert(n).second) continue;
        for (int in : model.inputs(n))
          if (!available(in)) stack.push_back(p.tensors[static_cast<size_t>(in)].producer);
      }
      ev.rerun.assign(rerun.begin(), rerun.end());
      std::set<int> leaves;
      for (int n : ev.rerun)
        for (int in : model.inputs(n))
          if (available(in)) leaves.insert(key[static_cast<size_t>(in)]);
      ev.leaves.assign(leaves.begin(), leaves.end());
      for (int k : ev.leaves) ++refs[static_cast<size_t>(k)];
    }
    const int index = static_cast<int>(evictions.size());
    if (is_sent)
      evict_after_send.push_back(index);
    else
      evict_after[static_cast<size_t>(last_local - b)].push_back(index);
    evictions.push_back(std::move(ev));
  }

  // Evictions by restore point, latest first: a backward walks the nodes downwards, and each
  // eviction becomes due once the walk reaches its restore point.
  std::vector<int> by_restore(evictions.size());
  for (size_t i = 0; i < by_restore.size(); ++i) by_restore[i] = static_cast<int>(i);
  std::stable_sort(by_restore.begin(), by_restore.end(), [&](int a, int c) {
    return evictions[static_cast<size_t>(a)].restore_before > evictions[static_cast<size_t>(c)].restore_before;
  });

  StageMemoryReplay r;
  int64_t live = weights + model.constant_bytes(b, e);  // constants: computed in the first forward
  int current_action = -1;
  auto note = [&](int64_t value, int node) {
    if (value > r.peak) r.peak = value, r.peak_action = current_action, r.peak_node = node;
  };
  note(live, -1);
  std::map<int64_t, MicroBatch> mbs;
  int64_t pending_send = 0;  // bytes only the transport still references
  int64_t param_grads = 0;
  std::vector<char> grad_done(static_cast<size_t>(e - b), 0);
  bool optimizer_state = false;
  int64_t version = 0;
  std::map<int64_t, int> version_users;
  const bool async = model.schedule() == ScheduleKind::Async;

  auto release = [&](MicroBatch& m, int k) {
    if (--m.refs[static_cast<size_t>(k)] != 0 || !m.alive[static_cast<size_t>(k)]) return;
    m.alive[static_cast<size_t>(k)] = 0;
    if (!m.evicted[static_cast<size_t>(k)]) live -= bytes(k);
  };
  auto evict = [&](MicroBatch& m, const Eviction& ev) {
    const size_t k = static_cast<size_t>(ev.key);
    if (!m.alive[k] || m.evicted[k]) return;
    m.evicted[k] = 1;
    live -= bytes(ev.key);
  };
  // Before node i's backward the evictor brings back what it (or a later node's backward)
  // reads: swaps, and recomputations re-running the union of their chains at once. Re-run nodes
  // are shared: every evicted recomputation whose producer re-runs comes back now too, and a
  // swapped tensor the chains read comes back early.
  // `next_due`: the first of by_restore not yet due in this backward. Every eviction due at an
  // earlier (higher) node was restored there, so only the newly due ones can be evicted still.
  auto restore_for = [&](MicroBatch& m, int i, size_t& next_due) {
    std::set<int> rerun_nodes;
    bool any = false;
    for (; next_due < by_restore.size() && evictions[static_cast<size_t>(by_restore[next_due])].restore_before >= i;
         ++next_due) {
      const Eviction& ev = evictions[static_cast<size_t>(by_restore[next_due])];
      const size_t k = static_cast<size_t>(ev.key);
      if (!m.evicted[k] || !m.alive[k]) continue;
      any = true;
      if (ev.recompute) rerun_nodes.insert(ev.rerun.begin(), ev.rerun.end());
    }
    if (!any) return;
    std::set<int> chain_reads;
    std::vector<const Eviction*> done;
    for (int n : rerun_nodes)
      for (int in : model.inputs(n))
        if (!rerun_nodes.count(p.tensors[static_cast<size_t>(in)].producer))
          chain_reads.insert(key[static_cast<size_t>(in)]);
    // Swaps come back first; the re-run then allocates every output of its nodes in order (the
    // rebuilt tensors among them), each node's workspace on top, and holds them all until the
    // rebuilt bytes move into the evicted storages.
    int64_t swapped_back = 0, rebuilt_back = 0;
    for (const Eviction& ev : evictions) {
      const size_t k = static_cast<size_t>(ev.key);
      if (!m.evicted[k] || !m.alive[k]) continue;
      const bool rebuilds = ev.recompute && rerun_nodes.count(ev.producer);
      if (ev.restore_before < i && !rebuilds && !(!ev.recompute && chain_reads.count(ev.key))) continue;
      m.evicted[k] = 0;
      (ev.recompute ? rebuilt_back : swapped_back) += bytes(ev.key);
      if (ev.recompute) done.push_back(&ev);
    }
    live += swapped_back;
    note(live, i);
    int64_t outputs = 0;
    for (int n : rerun_nodes) {
      int64_t out = 0;
      for (int t : p.nodes[static_cast<size_t>(n)].outputs)
        if (storage[static_cast<size_t>(t)] && key[static_cast<size_t>(t)] == t) out += bytes(t);
      note(live + outputs + out + p.nodes[static_cast<size_t>(n)].fwd_workspace, i);
      outputs += out;
    }
    live += rebuilt_back;
    for (const Eviction* ev : done)
      for (int k : ev->leaves) release(m, k);
  };
  auto sum_bytes = [&](const std::vector<TensorBytes>& list) {
    int64_t s = 0;
    for (const TensorBytes& t : list) s += t.bytes;
    return s;
  };
  const int64_t received_bytes = sum_bytes(received), sent_bytes = sum_bytes(sent);
  // Gradients travel back only for tensors autograd tracks.
  int64_t received_grad_bytes = 0;
  for (const TensorBytes& r : received)
    if (requires_grad[static_cast<size_t>(r.tensor)]) received_grad_bytes += r.bytes;
  // A transposed view is sent as a contiguous copy (MPI reads one dense buffer).
  int64_t permuted_sent_bytes = 0;
  for (const TensorBytes& s : sent) {
    const int contiguous = p.tensors[static_cast<size_t>(s.tensor)].contiguous;
    if (contiguous >= 0) {  // the profile says
      if (contiguous == 0) permuted_sent_bytes += s.bytes;
      continue;
    }
    for (int t = s.tensor; t >= 0; t = p.tensors[static_cast<size_t>(t)].alias_of)  // older profiles
      if (is_permute_kind(p.nodes[static_cast<size_t>(p.tensors[static_cast<size_t>(t)].producer)].kind)) {
        permuted_sent_bytes += s.bytes;
        break;
      }
  }
  // Receives allocate the tensors they receive. A send keeps what it sends referenced until
  // MPI completes it: found done by the next send (the receiver may not have taken it earlier).
  auto receive = [&](int64_t total) { live += total; };
  auto send = [&](int64_t held_by_send) {
    live -= pending_send;
    pending_send = held_by_send;
  };

  // Synchronous schedules: the list is one step; the second pass is the steady state (optimizer
  // state allocated). The async list runs long enough to reach its own.
  const std::vector<Action>& actions = model.actions(x);
  const size_t passes = async ? 1 : 2;
  for (size_t ai = 0; ai < passes * actions.size(); ++ai) {
    const Action& a = actions[ai % actions.size()];
    current_action = static_cast<int>(ai % actions.size());
    auto state = [&]() -> MicroBatch& {
      auto found = mbs.find(a.micro_batch);
      if (found != mbs.end()) return found->second;
      MicroBatch& m = mbs[a.micro_batch];
      m.refs = refs;
      m.alive.assign(static_cast<size_t>(T), 0);
      m.evicted.assign(static_cast<size_t>(T), 0);
      m.has_grad.assign(static_cast<size_t>(T), 0);
      m.permuted.assign(static_cast<size_t>(T), 0);
      return m;
    };
    switch (a.kind) {
      case ActionKind::RecvActivation: {
        MicroBatch& m = state();
        receive(received_bytes);
        for (const TensorBytes& t : received) m.alive[static_cast<size_t>(t.tensor)] = 1;
        break;
      }
      case ActionKind::Forward: {
        MicroBatch& m = state();
        if (async) {
          m.version = version;
          if (version_users[version]++ == 0) live += weights;  // the stashed copy
        }
        for (int t : data) m.alive[static_cast<size_t>(t)] = 1, live += bytes(t);
        note(live, -1);
        for (int n = b; n < e; ++n) {
          const NodeProfile& node = p.nodes[static_cast<size_t>(n)];
          if (model.node_kind_flags(n) & CostModel::kInputNode) continue;
          int64_t out = 0;
          for (int t : node.outputs)
            if (storage[static_cast<size_t>(t)] && key[static_cast<size_t>(t)] == t) out += bytes(t);
          note(live + out + node.fwd_workspace, n);
          live += out;
          for (int t : node.outputs) {
            if (!storage[static_cast<size_t>(t)] || key[static_cast<size_t>(t)] != t) continue;
            m.alive[static_cast<size_t>(t)] = 1;
            if (m.refs[static_cast<size_t>(t)] == 0) m.alive[static_cast<size_t>(t)] = 0, live -= bytes(t);
          }
          for (int i : evict_after[static_cast<size_t>(n - b)]) evict(m, evictions[static_cast<size_t>(i)]);
          for (int t : model.inputs(n)) release(m, key[static_cast<size_t>(t)]);
        }
        for (int t : data_read_later) release(m, t);
        break;
      }
      case ActionKind::SendActivation: {
        MicroBatch& m = state();
        // The activations stay referenced by the micro-batch anyway; sent tensors the evictor
        // empties next are sent as copies.
        const int64_t copies = evict_after_send.empty() ? permuted_sent_bytes : sent_bytes;
        live += copies;
        send(copies);
        for (int i : evict_after_send) evict(m, evictions[static_cast<size_t>(i)]);
        break;
      }
      case ActionKind::RecvGrad: {
        MicroBatch& m = state();
        int64_t total = 0;
        for (const TensorBytes& t : sent)
          if (requires_grad[static_cast<size_t>(t.tensor)])
            total += t.bytes, m.has_grad[static_cast<size_t>(t.tensor)] = 2;
        receive(total);
        m.received_grads = total;
        break;
      }
      case ActionKind::Backward: {
        MicroBatch& m = state();
        size_t next_due = 0;
        for (int i = e - 1; i >= b; --i) {
          const NodeProfile& node = p.nodes[static_cast<size_t>(i)];
          const char kind = model.node_kind_flags(i);
          if (kind & CostModel::kInputNode) continue;
          // The node's graph outputs (its internal buffers follow them), some with gradients.
          int out = -1;
          bool any_grad = false;
          for (int t : node.outputs)
            if (!p.tensors[static_cast<size_t>(t)].internal) {
              if (out < 0) out = t;
              any_grad |= requires_grad[static_cast<size_t>(t)] != 0;
            }
          if (!any_grad) continue;
          restore_for(m, i, next_due);
          // A view hands its output's gradient on as a view, unless its backward allocates one
          // of the input's size (slices, expands, splits).
          const bool view =
              !p.tensors[static_cast<size_t>(out)].owns_storage() && !(kind & CostModel::kViewAllocatesGradient);
          const char out_grad = m.has_grad[static_cast<size_t>(out)];
          int64_t grads = 0, transient = 0;
          bool passed_on = false;    // a view hands its output's gradient to its input
          bool copied_view = false;  // ... unless it must copy it first
          for (int t : model.inputs(i)) {
            if (!requires_grad[static_cast<size_t>(t)]) continue;
            char& g = m.has_grad[static_cast<size_t>(t)];
            if (g) {  // this node's contribution is summed into the existing gradient
              if (view) continue;
              transient += bytes(t);
              if (g == 2) {  // out of place: the stage still holds the received one
                grads += bytes(t), g = 1;
                // A tensor relayed to the next stage and read here: the sum is what goes back.
                if (is_received[static_cast<size_t>(t)]) m.input_grads += bytes(t);
              }
              continue;
            }
            passed_on = true;
            if (is_received[static_cast<size_t>(t)]) m.input_grads += bytes(t);  // held until sent back
            if (!view) {
              g = 1, grads += bytes(t);
            } else if ((kind & CostModel::kReshapeNode) && m.permuted[static_cast<size_t>(out)]) {
              g = 1, grads += bytes(t), copied_view = true;  // a permuted gradient is not viewable
            } else {                                         // a view of the output's gradient, with its owner
              g = out_grad ? out_grad : 1;
              m.permuted[static_cast<size_t>(t)] =
                  m.permuted[static_cast<size_t>(out)] || (kind & CostModel::kPermuteNode);
            }
          }
          if (view && !passed_on && out_grad == 1)
            live -= bytes(out);  // a view of a parameter, or summed into an existing gradient
          const int64_t pg = grad_at[static_cast<size_t>(i - b)];
          if (!grad_done[static_cast<size_t>(i - b)]) {
            grad_done[static_cast<size_t>(i - b)] = 1;
            grads += pg;
            param_grads += pg;
          } else {  // accumulated into the existing gradient
            const int64_t held = hold_from[static_cast<size_t>(i - b)], summed = hold_to[static_cast<size_t>(i - b)];
            transient += pg - held + summed;
            grads += held;
            live -= summed;
          }
          note(live + grads + transient + node.bwd_workspace, i);
          live += grads;
          for (int o : node.outputs)  // the graph outputs' gradients have been consumed
            if (!p.tensors[static_cast<size_t>(o)].internal && m.has_grad[static_cast<size_t>(o)] == 1 &&
                (!view || copied_view) && !is_received[static_cast<size_t>(o)])
              live -= bytes(o);
          for (int t : node.saved)
            for (int k : saver_keys(t)) release(m, k);
        }
        live -= m.received_grads;
        m.received_grads = 0;
        for (const TensorBytes& s : sent) release(m, key[static_cast<size_t>(s.tensor)]);
        if (last) release(m, loss);
        if (async && --version_users[m.version] == 0) {
          version_users.erase(m.version);
          live -= weights;
        }
        if (b == 0) mbs.erase(a.micro_batch);  // nothing to send back
        break;
      }
      case ActionKind::SendGrad: {
        MicroBatch& m = state();
        // Every received activation autograd tracks gets a gradient back (zeros where none flowed); the sent
        // gradients live until the send completes.
        const int64_t zeros = received_grad_bytes - m.input_grads;
        live += zeros;
        send(received_grad_bytes);
        for (const TensorBytes& t : received) release(m, t.tensor);
        mbs.erase(a.micro_batch);
        break;
      }
      case ActionKind::OptimizerStep: {
        const int64_t state_bytes = model.optimizer_multiplier() * weights;
        if (!optimizer_state) live += state_bytes, optimizer_state = true;
        if (model.optimizer() == "adam") note(live + std::min(p.largest_param_bytes, weights), -1);
        note(live, -1);
        live -= param_grads;
        param_grads = 0;
        std::fill(grad_done.begin(), grad_done.end(), 0);
        ++version;
        break;
      }
      default:
        break;
    }
    note(live, -1);
  }
  return r;
}

}  // namespace dawnpiper
