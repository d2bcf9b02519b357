#include "plan/stage_program.h"

#include <algorithm>
#include <optional>
#include <set>
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

namespace {

// One stage's evictions placed from its decisions (place_evictions below), in parts.
class EvictionPlacer {
 public:
  EvictionPlacer(const CostModel& model, int b, int e, const std::vector<char>& received)
      : model_(model),
        p_(model.profile()),
        b_(b),
        e_(e),
        received_(received),
        visited_(static_cast<size_t>(std::max(0, e - b)), -1) {}

  // The eviction of d's tensor, or nothing where this stage holds none of its storage.
  std::optional<Eviction> place(const TensorDecision& d, int mark);

  // Each tensor's action (-1: no decision; the last one for a tensor decided twice), in a
  // per-thread table sized by the graph but set and cleared only for these decisions: the
  // planner calls this for every decision set it replays, and re-runs look actions up often.
  static std::vector<signed char>& action_table() {
    static thread_local std::vector<signed char> action_by_tensor;
    return action_by_tensor;
  }

 private:
  bool in_range(int node) const { return node >= b_ && node < e_; }
  const std::string& name(int t) const { return p_.tensors[static_cast<size_t>(t)].name; }
  const TensorProfile& tensor(int t) const { return p_.tensors[static_cast<size_t>(t)]; }
  // On the device when a re-run needs it: data, what earlier stages send, kept and swapped tensors.
  bool available(int t) const {
    const int a = action_table()[static_cast<size_t>(t)];
    return tensor(t).is_data || tensor(t).producer < b_ || a == static_cast<int>(TensorAction::Keep) ||
           a == static_cast<int>(TensorAction::Swap);
  }
  const std::vector<int>& share_storage_with(int t);
  void add_rerun_chain(Eviction& ev, int producer, int mark);

  const CostModel& model_;
  const Profile& p_;
  const int b_, e_;
  const std::vector<char>& received_;
  std::vector<int> sharing_, aliases_, stack_;
  std::vector<int> visited_;  // per node of the stage: the eviction that last re-ran it
};

// The tensors sharing t's storage: the owner of its alias chain (stopping at a received tensor:
// the stage's copy) and the views of it, down to received ones.
const std::vector<int>& EvictionPlacer::share_storage_with(int t) {
  while (!received_[static_cast<size_t>(t)] && tensor(t).alias_of >= 0) t = tensor(t).alias_of;
  sharing_.clear();
  aliases_.assign(1, t);
  while (!aliases_.empty()) {
    const int u = aliases_.back();
    aliases_.pop_back();
    sharing_.push_back(u);
    for (int v : model_.alias_children(u))
      if (!received_[static_cast<size_t>(v)]) aliases_.push_back(v);
  }
  return sharing_;
}

// The stage's nodes a recomputation re-runs from `producer` back to tensors still available
// (its leaves), each once.
void EvictionPlacer::add_rerun_chain(Eviction& ev, int producer, int mark) {
  stack_.assign(1, producer);
  while (!stack_.empty()) {
    const int n = stack_.back();
    stack_.pop_back();
    if (visited_[static_cast<size_t>(n - b_)] == mark) continue;
    visited_[static_cast<size_t>(n - b_)] = mark;
    ev.rerun.push_back(n);
    for (int in : model_.inputs(n)) {
      if (available(in))
        ev.leaves.push_back(in);
      else if (in_range(tensor(in).producer))
        stack_.push_back(tensor(in).producer);
    }
  }
  std::sort(ev.rerun.begin(), ev.rerun.end());
  std::sort(ev.leaves.begin(), ev.leaves.end());
  ev.leaves.erase(std::unique(ev.leaves.begin(), ev.leaves.end()), ev.leaves.end());
}

std::optional<Eviction> EvictionPlacer::place(const TensorDecision& d, int mark) {
  const TensorProfile& t = tensor(d.tensor);
  if (t.param_view) throw ConfigError("plan evicts " + name(d.tensor) + ", a view of a parameter or buffer");
  if (!model_.evictable(d.tensor))
    throw ConfigError("plan evicts " + name(d.tensor) + ", an autograd-internal buffer the executor cannot reach");
  if (model_.copy_not_made(d.tensor, b_)) return std::nullopt;  // nothing to evict
  // A tensor of an earlier stage that reaches this one only as views of it (received as
  // tensors of their own): nothing here holds its storage.
  if (!t.is_data && t.producer < b_ && !received_[static_cast<size_t>(d.tensor)]) return std::nullopt;
  Eviction ev;
  ev.tensor = d.tensor;
  ev.action = d.action;
  if (t.internal) ev.internal = {t.producer, t.copy_of};
  int last_local = in_range(t.producer) ? t.producer : -1;
  // Read later: sent on, so emptied only after the send. Later stages load data themselves,
  // but a view of data made here is sent like any activation.
  bool read_later = false;
  for (int shared : share_storage_with(d.tensor))
    for (int c : tensor(shared).consumers) {
      if (in_range(c)) last_local = std::max(last_local, c);
      read_later |= c >= e_ && !tensor(shared).is_data;
    }
  // A data tensor this stage does not load, read here only through views an earlier stage
  // made and sent (an imported model's reshaped input ids): nothing here holds its storage.
  if (last_local < 0 && t.is_data) return std::nullopt;
  // Received and only relayed on (GPT-NeoX's rotary cosines, read here through views an
  // earlier stage made): the stage holds it until the send, as the replay counts; nothing to
  // evict. (The memory optimizer took it for a saved tensor of the stage's.)
  if (last_local < 0 && received_[static_cast<size_t>(d.tensor)]) return std::nullopt;
  if (last_local < 0)
    throw ConfigError("plan evicts " + name(d.tensor) + ", which stage nodes [" + std::to_string(b_) + ", " +
                      std::to_string(e_) + ") neither produce nor read");
  ev.evict_after = read_later ? -1 : last_local;
  ev.restore_before = in_range(d.restore_before) ? d.restore_before : last_local;
  ev.prefetch_at = d.action == TensorAction::Swap && in_range(d.prefetch_at)
                       ? std::max(d.prefetch_at, ev.restore_before)
                       : ev.restore_before;
  if (d.action == TensorAction::Recompute) {
    if (t.is_data || !in_range(t.producer))
      throw ConfigError("plan recomputes " + name(d.tensor) + ", which this stage does not produce");
    add_rerun_chain(ev, t.producer, mark);
  }
  return ev;
}

}  // namespace

std::vector<Eviction> place_evictions(const CostModel& model, int b, int e,
                                      const std::vector<TensorDecision>& decisions, const std::vector<char>& received) {
  const int T = static_cast<int>(model.profile().tensors.size());
  for (const TensorDecision& d : decisions)
    if (d.tensor < 0 || d.tensor >= T)
      throw ConfigError("plan decision for tensor " + std::to_string(d.tensor) + ", which the profile does not have");
  std::vector<signed char>& actions = EvictionPlacer::action_table();
  if (actions.size() < static_cast<size_t>(T)) actions.resize(static_cast<size_t>(T), -1);
  struct Clear {
    const std::vector<TensorDecision>& decisions;
    std::vector<signed char>& actions;
    ~Clear() {
      for (const TensorDecision& d : decisions) actions[static_cast<size_t>(d.tensor)] = -1;
    }
  } clear{decisions, actions};
  for (const TensorDecision& d : decisions) actions[static_cast<size_t>(d.tensor)] = static_cast<signed char>(d.action);

  EvictionPlacer placer(model, b, e, received);
  std::vector<Eviction> out;
  out.reserve(static_cast<size_t>(std::count_if(
      decisions.begin(), decisions.end(), [](const TensorDecision& d) { return d.action != TensorAction::Keep; })));
  for (const TensorDecision& d : decisions) {
    if (d.action == TensorAction::Keep) continue;
    if (std::optional<Eviction> ev = placer.place(d, static_cast<int>(out.size()))) out.push_back(std::move(*ev));
  }
  return out;
}

bool StageProgram::splits_backward() const {
  return std::any_of(actions.begin(), actions.end(),
                     [](const Action& a) { return a.kind == ActionKind::BackwardInput; });
}

StageProgram stage_program(const ScheduleTraits& traits, std::vector<Action> step_actions,
                           const std::vector<int>& tied_owner, int b, int e, int x, std::vector<Eviction> evictions) {
  StageProgram program;
  program.stage = x;
  program.begin = b;
  program.end = e;
  program.actions = add_tied_reductions(traits, std::move(step_actions),
                                        holds_tied_across(tied_owner, b, e) ? std::set<int>{x} : std::set<int>{});
  program.evictions = std::move(evictions);
  return program;
}

StageProgram stage_program(const CostModel& model, int b, int e, int x, const std::vector<TensorDecision>& decisions) {
  std::vector<int> tied_owner;
  for (const NodeProfile& n : model.profile().nodes) tied_owner.push_back(n.tied_owner);
  return stage_program(model.schedule().traits(), model.actions(x), tied_owner, b, e, x,
                       place_evictions(model, b, e, decisions));
}

}  // namespace dawnpiper
