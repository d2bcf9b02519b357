#include "profile/profile_builder.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <stdexcept>

namespace dawnpiper {

Profile profile_skeleton(const OpGraph& g, ProfileSource source, const std::string& device) {
  Profile p;
  p.model = g.model;
  p.preset = g.preset;
  p.device = device;
  p.source = source;
  p.precision = g.precision;
  p.graph_hash = g.fingerprint();
  p.micro_batch_size = g.micro_batch_size;
  p.profiled_batch_sizes = {g.micro_batch_size};
  p.blocks = g.blocks;
  const std::vector<bool> rg = g.requires_grad();
  const std::vector<Strides> strides = tensor_strides(g);
  for (const TensorInfo& t : g.tensors) {
    TensorProfile tp;
    tp.id = t.id;
    tp.name = t.name;
    tp.producer = t.producer;
    tp.consumers = t.consumers;
    tp.is_data = g.is_data(t.id);
    tp.requires_grad = rg[static_cast<size_t>(t.id)] ? 1 : 0;
    tp.contiguous = is_contiguous(t.shape, strides[static_cast<size_t>(t.id)]) ? 1 : 0;
    tp.relaid_on_receipt = receipt_layout(t.shape, t.strides).empty() ? 0 : 1;
    tp.bytes = t.bytes();
    tp.bytes_fit = {static_cast<double>(tp.bytes), 0};
    p.tensors.push_back(tp);
  }
  return p;
}

NodeProfile node_row(const OpGraph& g, int node, const std::vector<int>& depths, const std::vector<int>& tied_owners) {
  const Node& n = g.nodes.at(node);
  NodeProfile np;
  np.id = n.id;
  np.name = n.name;
  np.kind = n.kind == OpKind::Aten ? n.call.qualified() : op_kind_name(n.kind);
  np.block = n.block;
  np.depth = depths.at(node);
  np.param_bytes = g.parameter_bytes(n.id);
  np.tied_owner = tied_owners.at(static_cast<size_t>(node));
  for (const ParamSpec& ps : n.params)
    if (ps.tied()) np.tied_bytes += g.nodes[ps.tied_node].params[ps.tied_param].bytes();
  const StageConstant c = g.stage_constant(n.id);
  np.constant_key = c.key;
  np.constant_bytes = c.bytes;
  if (n.kind == OpKind::LinearCrossEntropy) {
    const Shape& hidden = g.tensor(n.inputs[0]).shape;
    const double positions_per_sample = static_cast<double>(numel(hidden) / hidden.back()) /
                                        static_cast<double>(std::max<int64_t>(1, g.micro_batch_size));
    np.workspace_full_at = static_cast<double>(n.attr_int("chunk_tokens", 1)) / positions_per_sample;
  }
  np.outputs = n.outputs;
  return np;
}

void add_saved(Profile& p, int t, int node) {
  while (p.tensors[t].alias_of >= 0) t = p.tensors[t].alias_of;
  auto& sb = p.tensors[t].saved_by;
  if (std::find(sb.begin(), sb.end(), node) == sb.end()) sb.push_back(node);
}

void add_internal(Profile& p, int node, int64_t bytes, int copy_of) {
  TensorProfile tp;
  tp.id = static_cast<int>(p.tensors.size());
  tp.name = p.nodes.at(node).name + (copy_of >= 0 ? ".copy_of_" + p.tensors.at(copy_of).name : ".internal");
  tp.copy_of = copy_of;
  tp.producer = node;
  tp.bytes = bytes;
  tp.bytes_fit = {static_cast<double>(bytes), 0};
  tp.saved_by = {node};
  tp.internal = true;
  tp.requires_grad = 0;
  p.tensors.push_back(tp);
  p.nodes[node].outputs.push_back(tp.id);
}

void add_internals(Profile& p, const OpGraph& g, const std::vector<Strides>& st, int node, int64_t bytes) {
  for (int in : matmul_copied_inputs(g, st, node)) {
    const int64_t copy = g.tensor(in).bytes();
    if (copy > bytes) break;
    add_internal(p, node, copy, in);
    bytes -= copy;
  }
  if (bytes > 0) add_internal(p, node, bytes);
}

namespace {

// (producer, copied input, order among the producer's buffers copying that input) -> row.
std::map<std::tuple<int, int, int>, int> internal_keys(const Profile& p) {
  std::map<std::tuple<int, int, int>, int> keys;
  std::map<std::pair<int, int>, int> seen;
  for (const TensorProfile& t : p.tensors)
    if (t.internal) keys[{t.producer, t.copy_of, seen[{t.producer, t.copy_of}]++}] = t.id;
  return keys;
}

}  // namespace

std::vector<ByteSamples> batch_byte_samples(Profile& base, const std::vector<Profile>& profiles,
                                            const std::vector<int64_t>& sizes) {
  std::vector<std::map<std::tuple<int, int, int>, int>> keys;
  for (const Profile& q : profiles) keys.push_back(internal_keys(q));
  std::map<std::tuple<int, int, int>, int> base_keys = internal_keys(base);
  for (size_t i = 1; i < profiles.size(); ++i)
    for (const auto& [key, row] : keys[i]) {
      if (base_keys.count(key)) continue;
      const TensorProfile& t = profiles[i].tensors[static_cast<size_t>(row)];
      add_internal(base, t.producer, 0, t.copy_of);
      base.nodes[static_cast<size_t>(t.producer)].saved.push_back(base.tensors.back().id);
      base_keys[key] = base.tensors.back().id;
    }
  std::vector<ByteSamples> samples(base.tensors.size());
  for (size_t i = 0; i < profiles.size(); ++i) {
    const Profile& q = profiles[i];
    auto add = [&](int base_row, int row) {
      samples[static_cast<size_t>(base_row)].x.push_back(static_cast<double>(sizes[i]));
      samples[static_cast<size_t>(base_row)].y.push_back(
          static_cast<double>(q.tensors[static_cast<size_t>(row)].bytes));
    };
    for (const TensorProfile& t : base.tensors)
      if (!t.internal && static_cast<size_t>(t.id) < q.tensors.size()) add(t.id, t.id);
    for (const auto& [key, row] : keys[i]) add(base_keys.at(key), row);
  }
  return samples;
}

LinearFit fit_line(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() < 2) return {y.empty() ? 0 : y[0], 0};
  double mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) mx += x[i], my += y[i];
  mx /= static_cast<double>(x.size());
  my /= static_cast<double>(y.size());
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < x.size(); ++i) sxy += (x[i] - mx) * (y[i] - my), sxx += (x[i] - mx) * (x[i] - mx);
  const double slope = sxx > 0 ? sxy / sxx : 0;
  return {my - slope * mx, slope};
}

LinearFit fit_workspace(std::vector<double> x, const std::vector<double>& y, double full_at) {
  if (full_at > 0)
    for (double& v : x) v = std::min(v, full_at);
  return fit_line(x, y);
}

LinearFit fit_bytes(const ByteSamples& s) {
  if (s.x.size() == 1) return {0, s.y[0] / s.x[0]};
  return fit_line(s.x, s.y);
}

void finish_profile(Profile& p, const OpGraph& g) {
  // Parameter gradients appear at the last user of each parameter (first in backward order).
  std::map<std::pair<int, int>, int> last_user;
  for (const Node& n : g.nodes)
    for (size_t i = 0; i < n.params.size(); ++i) {
      const ParamSpec& ps = n.params[i];
      last_user[ps.tied() ? std::make_pair(ps.tied_node, ps.tied_param) : std::make_pair(n.id, int(i))] = n.id;
    }
  for (const auto& [key, user] : last_user) {
    const int64_t bytes = g.nodes[key.first].params[key.second].bytes();
    p.nodes[user].param_grad_bytes += bytes;
    p.largest_param_bytes = std::max(p.largest_param_bytes, bytes);
  }
  for (TensorProfile& t : p.tensors) {
    std::sort(t.saved_by.begin(), t.saved_by.end());
    for (int s : t.saved_by) p.nodes[s].saved.push_back(t.id);
  }
  for (NodeProfile& n : p.nodes) {
    n.fwd_ms_fit = {n.fwd_ms, 0};
    n.bwd_ms_fit = {n.bwd_ms, 0};
    n.fwd_workspace_fit = {static_cast<double>(n.fwd_workspace), 0};
    n.bwd_workspace_fit = {static_cast<double>(n.bwd_workspace), 0};
    n.bwd_input_workspace_fit = {static_cast<double>(n.bwd_input_workspace), 0};
  }
}

}  // namespace dawnpiper
