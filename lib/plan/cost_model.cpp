#include "plan/cost_model.h"

#include <algorithm>
#include <map>
#include <set>

#include "graph/op_graph.h"
#include "util/error.h"

namespace dawnpiper {

namespace {
[[noreturn]] void bad_profile(const std::string& what) { throw ConfigError("malformed profile: " + what); }

// Per node, what its forward holds by its own tensors in any stage (CostModel::
// forward_need_bytes). A stage boundary can only lower it where a tensor is a copy (of a
// received tensor: not made) or a view (received: its own, smaller storage), so copies count
// nothing and a view read counts the smaller of itself and its owner.
std::vector<int64_t> forward_needs(const Profile& profile, const std::vector<std::vector<int>>& inputs,
                                   const std::vector<int>& alias_root) {
  std::vector<int64_t> need(profile.nodes.size(), 0);
  auto tensor = [&](int t) -> const TensorProfile& { return profile.tensors[static_cast<size_t>(t)]; };
  std::map<int, int64_t> read;  // storage owner -> bytes counted
  for (const NodeProfile& node : profile.nodes) {
    if (node_class(node.kind) == NodeClass::Input) continue;
    read.clear();
    for (int t : inputs[static_cast<size_t>(node.id)]) {
      const int root = alias_root[static_cast<size_t>(t)];
      if (tensor(t).param_view || tensor(root).param_view || tensor(root).copy_of >= 0) continue;
      const int64_t bytes = std::min(tensor(t).bytes, tensor(root).bytes);
      read[root] = std::max(read[root], bytes);
    }
    int64_t sum = node.fwd_workspace;
    for (const auto& [root, bytes] : read) sum += bytes;
    for (int t : node.outputs)
      if (tensor(t).owns_storage() && tensor(t).copy_of < 0) sum += tensor(t).bytes;
    // The zoo's loss may write its log-probabilities over the logits (stage_replay_walk.cpp).
    if (node_class(node.kind) == NodeClass::InPlaceLoss) {
      const LossInputs loss = loss_inputs(profile, node.id, inputs[static_cast<size_t>(node.id)]);
      if (loss.fp32) sum -= cross_entropy_overwrite_saving(tensor(loss.logits).bytes, tensor(loss.labels).bytes);
    }
    need[static_cast<size_t>(node.id)] = sum;
  }
  return need;
}
}  // namespace

CostModel::CostModel(const Profile& profile, const PlanOptions& options)
    : profile_(&profile), n_(profile.size()), stages_(options.stages) {
  take_options(options);
  index_nodes();
  const CrossingDiffs diffs = index_tensors();
  index_crossings(diffs);
  index_aliases();
  forward_need_ = RangeMax(forward_needs(profile, inputs_, alias_root_));
  index_gradients();
  index_split_conflicts();
}

bool feeds(const Profile& profile, int from, int to) {
  if (to < from) return false;
  std::vector<char> reached(static_cast<size_t>(to - from + 1), 0);  // fed by `from`
  reached[0] = 1;
  for (int k = from; k < to; ++k) {
    if (!reached[static_cast<size_t>(k - from)]) continue;
    for (int t : profile.nodes[static_cast<size_t>(k)].outputs)
      for (int c : profile.tensors[static_cast<size_t>(t)].consumers)
        if (c > k && c <= to) reached[static_cast<size_t>(c - from)] = 1;
  }
  return reached.back() != 0;
}

void CostModel::index_split_conflicts() {
  const Profile& p = *profile_;
  split_conflict_.assign(static_cast<size_t>(n_), -1);
  // One stage has no cut to move: make_plan refuses it with the pair (split_backward_refusal).
  if (stages_ < 2 || !schedule_.traits().splits_backward) return;
  std::map<int, std::vector<int>> readers;  // weight (its owning node) -> its readers, in order
  for (const NodeProfile& node : p.nodes) {
    const int weight = node.tied_owner >= 0 ? node.tied_owner : node.param_bytes > 0 ? node.id : -1;
    if (weight >= 0) readers[weight].push_back(node.id);
  }
  for (auto& [weight, nodes] : readers) {
    std::sort(nodes.begin(), nodes.end());
    for (size_t i = 0; i + 1 < nodes.size(); ++i)
      for (size_t j = i + 1; j < nodes.size(); ++j)
        if (feeds(p, nodes[i], nodes[j]))
          split_conflict_[static_cast<size_t>(nodes[j])] =
              std::max(split_conflict_[static_cast<size_t>(nodes[j])], nodes[i]);
  }
}

bool CostModel::split_refused(int b, int e) const {
  for (int n = b; n < e; ++n)
    if (split_conflict_[static_cast<size_t>(n)] >= b) return true;
  return false;
}

void CostModel::take_options(const PlanOptions& options) {
  if (stages_ < 1) throw ConfigError("the number of stages must be at least 1");
  if (options.micro_batches < 1) throw ConfigError("the number of micro-batches must be >= 1");
  if (!(options.host_bandwidth > 0) || !(options.link_bandwidth > 0) || options.replica_bandwidth < 0)
    throw ConfigError("host, link and replica bandwidths must be positive");
  schedule_ = options.schedule;
  host_bw_ = options.host_bandwidth;
  if (!options.host_bandwidth_given)
    host_link_ = options.host_link.measured() ? options.host_link : profile_->host_link;
  link_bw_ = options.link_bandwidth;
  replica_bw_ = options.replica_link_bandwidth();
  if (options.data_parallel < 1) throw ConfigError("data parallelism must be at least 1");
  data_parallel_ = options.data_parallel;
  zero_stage_ = options.sharding();
  bucket_bytes_ = options.bucket_bytes;
  if (zero_stage_ > 0 && bucket_bytes_ < 4) throw ConfigError("the bucket size must hold one fp32 element");
  micro_batches_ = options.micro_batches;
  optimizer_ = options.optimizer;
  const Schedule simulated =
      schedule_.make(stages_, schedule_.traits().simulated_micro_batches(stages_, options.micro_batches));
  for (int x = 0; x < stages_; ++x) stage_actions_.push_back(simulated.stage_actions(x));
  rank_actions_ = simulated.actions;
  stats_ = simulate_stages(simulated);
}

// Prefix sums of node times and parameters; the largest workspace of a range.
void CostModel::index_nodes() {
  const Profile& profile = *profile_;
  const int n = n_;
  for (int i = 0; i < n; ++i)
    if (profile.nodes[static_cast<size_t>(i)].id != i)
      bad_profile("node " + std::to_string(i) + " has id " + std::to_string(profile.nodes[static_cast<size_t>(i)].id));
  fwd_.assign(static_cast<size_t>(n) + 1, 0);
  bwd_.assign(static_cast<size_t>(n) + 1, 0);
  weight_.assign(static_cast<size_t>(n) + 1, 0);
  params_.assign(static_cast<size_t>(n) + 1, 0);
  std::vector<int64_t> transient(static_cast<size_t>(n), 0);
  for (int i = 0; i < n; ++i) {
    const NodeProfile& node = profile.nodes[static_cast<size_t>(i)];
    fwd_[i + 1] = fwd_[i] + node.fwd_ms;
    bwd_[i + 1] = bwd_[i] + node.bwd_ms;
    weight_[i + 1] = weight_[i] + node.bwd_ms * weight_share(node);
    params_[i + 1] = params_[i] + node.param_bytes;
    if (node.tied_owner >= 0) {  // (users come in order: each weight's list ascends)
      auto w = std::find_if(tied_weights_.begin(), tied_weights_.end(),
                            [&](const TiedWeight& t) { return t.owner == node.tied_owner; });
      if (w == tied_weights_.end())
        w = tied_weights_.insert(tied_weights_.end(), {node.tied_owner, {}, node.tied_bytes});
      w->users.push_back(i);
    }
    // (A split backward's I keeps what the node's functions saved until its end: the larger of
    // the two backward workspaces, whatever the schedule; the stage replay charges a whole
    // backward its own: StageReplay::backward_workspace.)
    transient[static_cast<size_t>(i)] = std::max({node.fwd_workspace, node.bwd_workspace, input_workspace(node)});
    if (node.constant_bytes > 0) constant_nodes_.push_back(i);
  }
  transient_ = RangeMax(transient);
}

// Each node's inputs, each tensor's savers (a view's saving counted on its storage owner) and
// last consumer, the saved bytes' prefix sums, and the per-cut differences of what crosses.
CostModel::CrossingDiffs CostModel::index_tensors() {
  const Profile& profile = *profile_;
  const int n = n_;
  const int t_count = static_cast<int>(profile.tensors.size());
  auto check_node = [&](int node, int tensor) {
    if (node < 0 || node >= n)
      bad_profile("tensor " + std::to_string(tensor) + " refers to node " + std::to_string(node));
  };
  inputs_.assign(static_cast<size_t>(n), {});
  saved_by_.assign(static_cast<size_t>(t_count), {});
  saved_at_.assign(static_cast<size_t>(n), {});
  last_consumer_.assign(static_cast<size_t>(t_count), -1);
  std::vector<int64_t> saved_node_bytes(static_cast<size_t>(n), 0);
  std::vector<DominanceSum::Point> repeats, spans;
  CrossingDiffs diffs;
  std::vector<int64_t>& count_diff = diffs.count;
  std::vector<int64_t>& bytes_diff = diffs.bytes;
  count_diff.assign(static_cast<size_t>(n) + 2, 0);
  bytes_diff.assign(static_cast<size_t>(n) + 2, 0);

  for (int t = 0; t < t_count; ++t) {
    const TensorProfile& tp = profile.tensors[static_cast<size_t>(t)];
    if (tp.id != t) bad_profile("tensor " + std::to_string(t) + " has id " + std::to_string(tp.id));
    check_node(tp.producer, t);
    int last = -1;
    for (int c : tp.consumers) {
      check_node(c, t);
      if (c < tp.producer)
        bad_profile("tensor " + std::to_string(t) + " is consumed by node " + std::to_string(c) +
                    " before its producer " + std::to_string(tp.producer));
      std::vector<int>& in = inputs_[static_cast<size_t>(c)];
      if (std::find(in.begin(), in.end(), t) == in.end()) in.push_back(t);
      last = std::max(last, c);
    }
    last_consumer_[static_cast<size_t>(t)] = last;

    std::vector<int> savers = tp.saved_by;
    for (int s : savers) check_node(s, t);
    // Views (of another tensor or of a parameter) allocate nothing: the profiler records
    // their saving on the storage owner.
    if (!tp.owns_storage()) savers.clear();
    std::sort(savers.begin(), savers.end());
    savers.erase(std::unique(savers.begin(), savers.end()), savers.end());
    for (size_t j = 0; j < savers.size(); ++j) {
      saved_node_bytes[static_cast<size_t>(savers[j])] += tp.bytes;
      saved_at_[static_cast<size_t>(savers[j])].push_back(t);
      if (j > 0) repeats.push_back({savers[j - 1], savers[j], tp.bytes});
    }
    saved_by_[static_cast<size_t>(t)] = std::move(savers);

    // Sent between stages: non-data tensors read after the node that produced them.
    if (!tp.is_data && last > tp.producer) {
      count_diff[static_cast<size_t>(tp.producer) + 1] += 1;
      count_diff[static_cast<size_t>(last) + 1] -= 1;
      bytes_diff[static_cast<size_t>(tp.producer) + 1] += tp.bytes;
      bytes_diff[static_cast<size_t>(last) + 1] -= tp.bytes;
      spans.push_back({n - tp.producer, n - last, tp.bytes});
    }
  }
  saved_sum_.assign(static_cast<size_t>(n) + 1, 0);
  for (int i = 0; i < n; ++i) saved_sum_[i + 1] = saved_sum_[i] + saved_node_bytes[i];
  saved_repeats_ = DominanceSum(n, repeats);
  spanning_ = DominanceSum(n + 1, spans);

  return diffs;
}

// Per cut: how many tensors and bytes cross it, and which tensors.
void CostModel::index_crossings(const CrossingDiffs& diffs) {
  const Profile& profile = *profile_;
  const int n = n_;
  const int t_count = static_cast<int>(profile.tensors.size());
  cross_count_.assign(static_cast<size_t>(n) + 1, 0);
  cross_bytes_.assign(static_cast<size_t>(n) + 1, 0);
  cross_begin_.assign(static_cast<size_t>(n) + 2, 0);
  int64_t c = 0, bytes = 0;
  for (int cut = 0; cut <= n; ++cut) {
    c += diffs.count[static_cast<size_t>(cut)];
    bytes += diffs.bytes[static_cast<size_t>(cut)];
    cross_count_[static_cast<size_t>(cut)] = c;
    cross_bytes_[static_cast<size_t>(cut)] = bytes;
    cross_begin_[static_cast<size_t>(cut) + 1] = cross_begin_[static_cast<size_t>(cut)] + c;
  }
  // The crossing lists, one slice per cut (the replays ask for them on every stage they try).
  cross_tensors_.resize(static_cast<size_t>(cross_begin_.back()));
  std::vector<int64_t> fill(cross_begin_.begin(), cross_begin_.end() - 1);
  for (int t = 0; t < t_count; ++t) {
    const TensorProfile& tp = profile.tensors[static_cast<size_t>(t)];
    if (tp.is_data) continue;
    for (int cut = tp.producer + 1; cut <= last_consumer_[static_cast<size_t>(t)]; ++cut)
      cross_tensors_[static_cast<size_t>(fill[static_cast<size_t>(cut)]++)] = t;
  }
}

// Alias trees and copies, data tensors, and which tensors the runtime can evict.
void CostModel::index_aliases() {
  const Profile& profile = *profile_;
  const int t_count = static_cast<int>(profile.tensors.size());
  alias_children_.assign(static_cast<size_t>(t_count), {});
  copies_of_.assign(static_cast<size_t>(t_count), {});
  alias_root_.assign(static_cast<size_t>(t_count), 0);
  for (int t = 0; t < t_count; ++t) {
    const TensorProfile& tp = profile.tensors[static_cast<size_t>(t)];
    if (tp.alias_of >= t_count || tp.copy_of >= t_count)
      bad_profile("tensor " + std::to_string(t) + " refers to tensor " +
                  std::to_string(std::max(tp.alias_of, tp.copy_of)));
    if (tp.alias_of >= 0) alias_children_[static_cast<size_t>(tp.alias_of)].push_back(t);
    if (tp.copy_of >= 0) copies_of_[static_cast<size_t>(tp.copy_of)].push_back(t);
    if (tp.is_data) data_tensors_.push_back(t);
    int root = t;
    for (int steps = 0; profile.tensors[static_cast<size_t>(root)].alias_of >= 0; ++steps) {
      if (steps > t_count) bad_profile("tensor " + std::to_string(t) + " has a cycle of alias_of");
      root = profile.tensors[static_cast<size_t>(root)].alias_of;
    }
    alias_root_[static_cast<size_t>(t)] = root;
  }
  // Internal buffers the executor holds, one handle per (producer, copied input): a matmul
  // reading one tensor twice copies it twice, which the executor does not tell apart.
  std::map<std::pair<int, int>, int> internal_keys;
  for (const TensorProfile& tp : profile.tensors)
    if (tp.internal) ++internal_keys[{tp.producer, tp.copy_of}];
  evictable_.assign(static_cast<size_t>(t_count), 0);
  for (int t = 0; t < t_count; ++t) {
    const TensorProfile& tp = profile.tensors[static_cast<size_t>(t)];
    evictable_[static_cast<size_t>(t)] =
        !tp.param_view &&
        (!tp.internal || (exposed_internal(profile, tp) && internal_keys[{tp.producer, tp.copy_of}] == 1));
  }
}

void CostModel::index_gradients() {
  const Profile& profile = *profile_;
  const int n = n_;
  const int t_count = static_cast<int>(profile.tensors.size());
  // Which tensors carry gradients: outputs of nodes with parameters or with such inputs, unless
  // the profile says.
  node_classes_.assign(profile.nodes.size(), NodeClass::Other);
  for (const NodeProfile& node : profile.nodes) {
    node_classes_[static_cast<size_t>(node.id)] = dawnpiper::node_class(node.kind);
    imported_ = imported_ || imported_kind(node.kind);
  }
  requires_grad_.assign(profile.tensors.size(), 0);
  for (const NodeProfile& node : profile.nodes) {
    bool rg = (node.param_bytes > 0 || node.param_grad_bytes > 0 || node.tied_bytes > 0) &&
              node_class(node.id) != NodeClass::Input;
    for (int t : inputs(node.id)) rg = rg || requires_grad_[static_cast<size_t>(t)];
    for (int t : node.outputs) {
      const TensorProfile& tp = profile.tensors[static_cast<size_t>(t)];
      requires_grad_[static_cast<size_t>(t)] = tp.requires_grad >= 0 ? tp.requires_grad == 1 : rg && !tp.internal;
    }
  }
  bytes_.resize(static_cast<size_t>(t_count));
  internal_.resize(static_cast<size_t>(t_count));
  owns_storage_.resize(static_cast<size_t>(t_count));
  for (const TensorProfile& tp : profile.tensors) {
    bytes_[static_cast<size_t>(tp.id)] = tp.bytes;
    internal_[static_cast<size_t>(tp.id)] = tp.internal;
    owns_storage_[static_cast<size_t>(tp.id)] = tp.owns_storage();
  }
  graph_output_.assign(static_cast<size_t>(n), -1);
  has_backward_.assign(static_cast<size_t>(n), 0);
  for (const NodeProfile& node : profile.nodes) {
    for (int t : node.outputs) {
      if (internal_[static_cast<size_t>(t)]) continue;
      if (graph_output_[static_cast<size_t>(node.id)] < 0) graph_output_[static_cast<size_t>(node.id)] = t;
      if (requires_grad_[static_cast<size_t>(t)] && node_class(node.id) != NodeClass::Input)
        has_backward_[static_cast<size_t>(node.id)] = 1;
    }
  }
}

int64_t CostModel::activation_bytes(int b, int e) const {
  if (e <= b) return 0;
  // Every (tensor, saver) pair in range, minus consecutive savers of the same tensor that are
  // both in range, leaves each tensor counted once.
  return saved_sum_[e] - saved_sum_[b] - saved_repeats_.weight(b, e);
}

int64_t CostModel::constant_bytes(int b, int e) const {
  std::set<std::string> keys;
  int64_t sum = 0;
  for (auto it = std::lower_bound(constant_nodes_.begin(), constant_nodes_.end(), b);
       it != constant_nodes_.end() && *it < e; ++it) {
    const NodeProfile& node = profile_->nodes[static_cast<size_t>(*it)];
    if (keys.insert(node.constant_key).second) sum += node.constant_bytes;
  }
  return sum;
}

MemoryBreakdown CostModel::memory(int b, int e, int x, int64_t activation_per_micro_batch) const {
  MemoryBreakdown m;
  const int64_t weights = held_param_bytes(b, e);
  m.weights = resident_weight_bytes(weights);
  m.weight_versions = std::max(1, weight_versions(x));
  m.stashed_weights = static_cast<int64_t>(m.weight_versions - 1) * m.weights;
  m.gradients = gradient_bytes(weights);
  m.optimizer = optimizer_state_bytes(weights);
  m.activation_per_micro_batch = activation_per_micro_batch;
  m.in_flight = in_flight(x);
  m.activations = m.in_flight * activation_per_micro_batch;
  m.transient = transient_bytes(b, e);
  m.constants = constant_bytes(b, e);
  m.runtime = runtime_bytes();
  return m;
}

int64_t CostModel::memory_floor(int b, int e, int x, bool evictable) const {
  const MemoryBreakdown m = memory(b, e, x, evictable ? 0 : activation_bytes(b, e));
  return std::max(m.total(), m.weights + m.optimizer + m.constants + m.runtime + forward_need_bytes(b, e));
}

double CostModel::balanced_group_peak(int b, int e, int x0, int x1) const {
  const double weights = static_cast<double>(param_bytes(b, e));
  const double acts = static_cast<double>(activation_bytes(b, e));
  // A copy of a tied weight is not spread over the group: the stage reading it holds all of it
  // (the last, for an LM head), also where the group's own cuts part it from its owner.
  int64_t copy = tied_copy_bytes(b, e);
  if (x1 > x0)
    for (const TiedWeight& w : tied_weights_)
      if (w.owner >= b && w.owner < e && w.users.back() > w.owner && w.users.back() < e) copy += w.bytes;
  const double state = static_cast<double>(optimizer_state_bytes(param_bytes(b, e)));
  auto per_stage = [&](int x) { return (std::max(1, weight_versions(x)) + 1) * weights + state + in_flight(x) * acts; };
  const double held_copy = (std::max(1, weight_versions(x1)) + 1) * static_cast<double>(copy) +
                           static_cast<double>(optimizer_state_bytes(copy));
  // Stage x holding a fraction f of the range peaks at f * (a_x W + c_x A) + transient (+ the
  // copy on x1); equal peaks P across the group give sum_x (P - T - copy_x) / (a_x W + c_x A) = 1.
  double inverse_sum = 0;
  for (int x = x0; x <= x1; ++x) {
    const double each = per_stage(x);
    if (each <= 0) return static_cast<double>(transient_bytes(b, e)) + held_copy;
    inverse_sum += 1.0 / each;
  }
  return static_cast<double>(transient_bytes(b, e)) + (1 + held_copy / per_stage(x1)) / inverse_sum;
}

std::vector<TensorBytes> CostModel::crossing(int cut) const {
  std::vector<TensorBytes> out;
  const int64_t begin = cross_begin_[static_cast<size_t>(cut)], end = cross_begin_[static_cast<size_t>(cut) + 1];
  out.reserve(static_cast<size_t>(end - begin));
  for (int64_t i = begin; i < end; ++i) {
    const int t = cross_tensors_[static_cast<size_t>(i)];
    out.push_back({t, bytes_[static_cast<size_t>(t)]});
  }
  return out;
}

int CostModel::spanning_count(int lo, int hi) const {
  // producer < lo  <=>  n - producer >= n - lo + 1;  last >= hi  <=>  n - last < n - hi + 1.
  return static_cast<int>(spanning_.count(n_ - lo + 1, n_ - hi + 1));
}

int64_t CostModel::spanning_bytes(int lo, int hi) const { return spanning_.weight(n_ - lo + 1, n_ - hi + 1); }

void CostModel::spanning(int lo, int hi, int& count, int64_t& bytes) const {
  int64_t c;
  spanning_.query(n_ - lo + 1, n_ - hi + 1, bytes, c);
  count = static_cast<int>(c);
}

int CostModel::producer(int tensor) const { return profile_->tensors[static_cast<size_t>(tensor)].producer; }

bool CostModel::is_data(int tensor) const { return profile_->tensors[static_cast<size_t>(tensor)].is_data; }

bool CostModel::copy_not_made(int tensor, int b) const {
  const int source = profile_->tensors[static_cast<size_t>(tensor)].copy_of;
  return source >= 0 && !is_data(source) && producer(source) < b && !relaid_on_receipt(source);
}

bool CostModel::permuted(int tensor) const {
  const int contiguous = profile_->tensors[static_cast<size_t>(tensor)].contiguous;
  if (contiguous >= 0) return contiguous == 0;                                          // the profile says
  for (int t = tensor; t >= 0; t = profile_->tensors[static_cast<size_t>(t)].alias_of)  // older profiles
    if (producer(t) >= 0 && node_class(producer(t)) == NodeClass::Permute) return true;
  return false;
}

bool CostModel::relaid_on_receipt(int tensor) const {
  const int relaid = profile_->tensors[static_cast<size_t>(tensor)].relaid_on_receipt;
  if (relaid >= 0) return relaid == 1;  // the profile says
  // Older profiles: a permuted view of all of its storage (a transposed slice is relaid too).
  return imported_ && permuted(tensor) && tensor_bytes(tensor) == tensor_bytes(alias_root(tensor));
}

double CostModel::recompute_ms(int node) const {
  // A profile without recompute measurements (0) falls back to the forward time.
  const NodeProfile& p = profile_->nodes[static_cast<size_t>(node)];
  return p.recompute_ms > 0 ? p.recompute_ms : p.fwd_ms;
}

double CostModel::allreduce_ms(int b, int e) const {
  if (data_parallel_ <= 1) return 0;
  const double d = static_cast<double>(data_parallel_);
  // Passes over the parameters' bytes per update (a step's micro-batches under a synchronous
  // schedule, one under async, which runs levels 0 and 1 only: plan_options.h's zero_refusal).
  // The levels above 0 gather the parameters in the compute precision: bf16, half the bytes.
  const double m = static_cast<double>(micro_batches_);
  const double gather = zero_stage_ > 0 && profile_->precision == Precision::Bf16 ? 0.5 : 1;
  const double passes = zero_stage_ >= 3 ? (1 + 2 * gather) * m : zero_stage_ == 2 ? m + gather : 1 + gather;
  return passes * (d - 1) / d * replica_link_ms(held_param_bytes(b, e));
}

int64_t CostModel::tied_copy_bytes(int b, int e) const {
  int64_t bytes = 0;
  for (const TiedWeight& w : tied_weights_) {  // owned elsewhere, read here
    const auto user = std::lower_bound(w.users.begin(), w.users.end(), b);
    if ((w.owner < b || w.owner >= e) && user != w.users.end() && *user < e) bytes += w.bytes;
  }
  return bytes;
}

int64_t CostModel::tied_across_bytes(int b, int e) const {
  int64_t bytes = tied_copy_bytes(b, e);
  for (const TiedWeight& w : tied_weights_)  // owned here, read elsewhere
    if (w.owner >= b && w.owner < e && (w.users.front() < b || w.users.back() >= e)) bytes += w.bytes;
  return bytes;
}

CostModel::Collectives CostModel::collectives(int b, int e) const {
  Collectives c;
  if (data_parallel_ <= 1) return c;
  const double d = static_cast<double>(data_parallel_);
  auto pass = [&](int64_t bytes) { return (d - 1) / d * replica_link_ms(bytes); };
  const int64_t all = held_param_bytes(b, e), tied = std::min(all, tied_across_bytes(b, e)), streamed = all - tied;
  const double gather = zero_stage_ > 0 && profile_->precision == Precision::Bf16 ? 0.5 : 1;
  // The last bucket starts when the pass ends (at the latest; parameter by parameter, all of it).
  const double tail = bucket_bytes_ > 0 && streamed > 0
                          ? std::min(1.0, static_cast<double>(bucket_bytes_) / static_cast<double>(streamed))
                          : 1;
  switch (zero_stage_) {
    case 0:  // (the tied weights' buckets start when the pass ends)
      c.reduce_ms = 2 * pass(all);
      c.reduce_tail_ms = 2 * pass(tied) + tail * 2 * pass(streamed);
      break;
    case 1:
      c.reduce_ms = pass(streamed);
      c.reduce_tail_ms = tail * pass(streamed);
      c.at_update_ms = pass(tied) + gather * pass(all);
      break;
    case 2:
      c.pass_ms = pass(streamed);
      c.at_update_ms = pass(tied) + gather * pass(all);
      break;
    default:
      c.gather_ms = gather * pass(all);
      c.pass_ms = gather * pass(all) + pass(streamed);
      c.at_update_ms = pass(tied);
  }
  return c;
}

double CostModel::update_ms(int b, int e) const {
  const double whole = profile_->update_ms.of(optimizer_);
  if (whole <= 0 || params_.back() <= 0) return 0;
  const double shards = zero_stage_ > 0 ? static_cast<double>(data_parallel_) : 1;
  return whole * static_cast<double>(held_param_bytes(b, e)) / static_cast<double>(params_.back()) / shards;
}

double CostModel::update_per_micro_batch_ms(int b, int e) const {
  return schedule_.traits().updates_once_per_step ? update_ms(b, e) / static_cast<double>(micro_batches_)
                                                  : update_ms(b, e);
}

double CostModel::allreduce_per_micro_batch_ms(int b, int e) const {
  // Replicas average before each update: once a step, or after every micro-batch.
  return schedule_.traits().updates_once_per_step ? allreduce_ms(b, e) / static_cast<double>(micro_batches_)
                                                  : allreduce_ms(b, e);
}

}  // namespace dawnpiper
