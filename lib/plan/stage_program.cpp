#include "plan/stage_program.h"

#include <algorithm>
#include <string>

#include "util/error.h"

namespace dawnpiper {

std::vector<Eviction> place_evictions(const CostModel& model, int b, int e,
                                      const std::vector<TensorDecision>& decisions) {
  const Profile& p = model.profile();
  const int T = static_cast<int>(p.tensors.size());
  if (std::all_of(decisions.begin(), decisions.end(), [&](const TensorDecision& d) {
        return d.action == TensorAction::Keep && d.tensor >= 0 && d.tensor < T;
      }))
    return {};  // the planner asks this often (stages without evictions)
  std::vector<char> received(static_cast<size_t>(T), 0);
  if (b > 0)
    for (const TensorBytes& r : model.crossing(b)) received[static_cast<size_t>(r.tensor)] = 1;
  return place_evictions(model, b, e, decisions, received);
}

std::vector<Eviction> place_evictions(const CostModel& model, int b, int e,
                                      const std::vector<TensorDecision>& decisions, const std::vector<char>& received) {
  const Profile& p = model.profile();
  const int T = static_cast<int>(p.tensors.size());
  auto in_range = [&](int node) { return node >= b && node < e; };
  auto name = [&](int t) { return p.tensors[static_cast<size_t>(t)].name; };
  for (const TensorDecision& d : decisions)
    if (d.tensor < 0 || d.tensor >= T)
      throw ConfigError("plan decision for tensor " + std::to_string(d.tensor) + ", which the profile does not have");
  // Each tensor's action (-1: no decision; the last one for a tensor decided twice), in a
  // per-thread table sized by the graph but set and cleared only for these decisions: the
  // planner calls this for every decision set it replays, and re-runs look actions up often.
  static thread_local std::vector<signed char> action_by_tensor;
  if (action_by_tensor.size() < static_cast<size_t>(T)) action_by_tensor.resize(static_cast<size_t>(T), -1);
  struct Clear {
    const std::vector<TensorDecision>& decisions;
    ~Clear() {
      for (const TensorDecision& d : decisions) action_by_tensor[static_cast<size_t>(d.tensor)] = -1;
    }
  } clear{decisions};
  for (const TensorDecision& d : decisions)
    action_by_tensor[static_cast<size_t>(d.tensor)] = static_cast<signed char>(d.action);
  auto action_of = [&](int t) { return static_cast<int>(action_by_tensor[static_cast<size_t>(t)]); };
  // On the device when a re-run needs it: data, what earlier stages send, kept and swapped tensors.
  auto available = [&](int t) {
    const int a = action_of(t);
    return p.tensors[static_cast<size_t>(t)].is_data || p.tensors[static_cast<size_t>(t)].producer < b ||
           a == static_cast<int>(TensorAction::Keep) || a == static_cast<int>(TensorAction::Swap);
  };
  // The tensors sharing t's storage: the owner of its alias chain (stopping at a received
  // tensor: the stage's copy) and the views of it, down to received ones.
  std::vector<int> sharing, aliases;
  auto share_storage_with = [&](int t) -> const std::vector<int>& {
    while (!received[static_cast<size_t>(t)] && p.tensors[static_cast<size_t>(t)].alias_of >= 0)
      t = p.tensors[static_cast<size_t>(t)].alias_of;
    sharing.clear();
    aliases.assign(1, t);
    while (!aliases.empty()) {
      const int u = aliases.back();
      aliases.pop_back();
      sharing.push_back(u);
      for (int v : model.alias_children(u))
        if (!received[static_cast<size_t>(v)]) aliases.push_back(v);
    }
    return sharing;
  };

  std::vector<Eviction> out;
  out.reserve(static_cast<size_t>(std::count_if(
      decisions.begin(), decisions.end(), [](const TensorDecision& d) { return d.action != TensorAction::Keep; })));
  std::vector<int> visited(static_cast<size_t>(std::max(0, e - b)), -1), stack;  // per node: the decision
  for (const TensorDecision& d : decisions) {
    if (d.action == TensorAction::Keep) continue;
    const TensorProfile& t = p.tensors[static_cast<size_t>(d.tensor)];
    if (t.param_view) throw ConfigError("plan evicts " + name(d.tensor) + ", a view of a parameter or buffer");
    if (!model.evictable(d.tensor))
      throw ConfigError("plan evicts " + name(d.tensor) + ", an autograd-internal buffer the executor cannot reach");
    if (model.copy_not_made(d.tensor, b)) continue;  // nothing to evict
    // A tensor of an earlier stage that reaches this one only as views of it (received as
    // tensors of their own): nothing here holds its storage.
    if (!t.is_data && t.producer < b && !received[static_cast<size_t>(d.tensor)]) continue;
    Eviction ev;
    ev.tensor = d.tensor;
    ev.action = d.action;
    if (t.internal) ev.internal = {t.producer, t.copy_of};
    int last_local = in_range(t.producer) ? t.producer : -1;
    // Read later: sent on, so emptied only after the send. Later stages load data themselves,
    // but a view of data made here is sent like any activation.
    bool read_later = false;
    for (int shared : share_storage_with(d.tensor))
      for (int c : p.tensors[static_cast<size_t>(shared)].consumers) {
        if (in_range(c)) last_local = std::max(last_local, c);
        read_later |= c >= e && !p.tensors[static_cast<size_t>(shared)].is_data;
      }
    // A data tensor this stage does not load, read here only through views an earlier stage
    // made and sent (an imported model's reshaped input ids): nothing here holds its storage.
    if (last_local < 0 && t.is_data) continue;
    if (last_local < 0)
      throw ConfigError("plan evicts " + name(d.tensor) + ", which stage nodes [" + std::to_string(b) + ", " +
                        std::to_string(e) + ") neither produce nor read");
    ev.evict_after = read_later ? -1 : last_local;
    ev.restore_before = in_range(d.restore_before) ? d.restore_before : last_local;
    ev.prefetch_at = d.action == TensorAction::Swap && in_range(d.prefetch_at)
                         ? std::max(d.prefetch_at, ev.restore_before)
                         : ev.restore_before;
    if (d.action == TensorAction::Recompute) {
      if (t.is_data || !in_range(t.producer))
        throw ConfigError("plan recomputes " + name(d.tensor) + ", which this stage does not produce");
      const int mark = static_cast<int>(out.size());
      stack.assign(1, t.producer);
      while (!stack.empty()) {
        const int n = stack.back();
        stack.pop_back();
        if (visited[static_cast<size_t>(n - b)] == mark) continue;
        visited[static_cast<size_t>(n - b)] = mark;
        ev.rerun.push_back(n);
        for (int in : model.inputs(n)) {
          if (available(in))
            ev.leaves.push_back(in);
          else if (in_range(p.tensors[static_cast<size_t>(in)].producer))
            stack.push_back(p.tensors[static_cast<size_t>(in)].producer);
        }
      }
      std::sort(ev.rerun.begin(), ev.rerun.end());
      std::sort(ev.leaves.begin(), ev.leaves.end());
      ev.leaves.erase(std::unique(ev.leaves.begin(), ev.leaves.end()), ev.leaves.end());
    }
    out.push_back(std::move(ev));
  }
  return out;
}

bool holds_tied_across(const Profile& p, int b, int e) {
  for (const NodeProfile& n : p.nodes)
    if (n.tied_owner >= 0 && (n.id >= b && n.id < e) != (n.tied_owner >= b && n.tied_owner < e)) return true;
  return false;
}

StageProgram stage_program(const CostModel& model, int b, int e, int x, const std::vector<TensorDecision>& decisions) {
  StageProgram program;
  program.stage = x;
  program.begin = b;
  program.end = e;
  const bool reduces = model.schedule() != ScheduleKind::Async && holds_tied_across(model.profile(), b, e);
  program.actions = reduces ? with_tied_reduce(model.actions(x)) : model.actions(x);
  program.evictions = place_evictions(model, b, e, decisions);
  return program;
}

}  // namespace dawnpiper
