#include "graph/op_graph.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <stdexcept>

#include "util/error.h"

namespace dawnpiper {

namespace {
// clang-format off
const char* const kKindNames[] = {
    "input",       "embedding",      "pos_embedding", "linear",       "layernorm",     "rmsnorm",   "gelu",
    "relu",        "tanh",           "dropout",       "reshape",      "transpose",     "matmul",    "scale",
    "causal_mask", "softmax",        "add",           "conv2d",       "batchnorm2d",   "maxpool2d", "avgpool2d",
    "concat",      "global_avgpool", "mul",           "sub",          "div",           "erf",       "sqrt",
    "mean",        "affine",         "scale_shift",   "rel_pos_bias", "cross_entropy", "linear_cross_entropy",
    "aten",
};
// clang-format on
constexpr int kKindCount = sizeof(kKindNames) / sizeof(kKindNames[0]);
static_assert(kKindCount == static_cast<int>(OpKind::Aten) + 1, "kind names out of sync");

}  // namespace

const char* op_kind_name(OpKind kind) { return kKindNames[static_cast<int>(kind)]; }

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t Node::attr_int(const std::string& key, int64_t fallback) const {
  auto it = ints.find(key);
  return it == ints.end() || it->second.empty() ? fallback : it->second[0];
}

const std::vector<int64_t>& Node::attr_ints(const std::string& key) const {
  auto it = ints.find(key);
  if (it == ints.end()) throw std::logic_error("node " + name + " has no attribute " + key);
  return it->second;
}

double Node::attr_real(const std::string& key, double fallback) const {
  auto it = reals.find(key);
  return it == reals.end() ? fallback : it->second;
}

int OpGraph::add_block(const std::string& name) {
  blocks.push_back(name);
  return static_cast<int>(blocks.size()) - 1;
}

int OpGraph::add(OpKind kind, const std::string& name, std::vector<int> inputs, Shape out_shape,
                 std::vector<ParamSpec> params, DType out_dtype) {
  if (blocks.empty()) add_block("main");
  Node n;
  n.id = size();
  n.kind = kind;
  n.name = name;
  n.block = static_cast<int>(blocks.size()) - 1;
  n.inputs = std::move(inputs);
  n.params = std::move(params);
  TensorInfo t;
  t.id = static_cast<int>(tensors.size());
  t.producer = n.id;
  t.shape = std::move(out_shape);
  t.dtype = out_dtype;
  t.name = name;
  n.outputs.push_back(t.id);
  for (int in : n.inputs) {
    auto& cons = tensors.at(in).consumers;
    if (cons.empty() || cons.back() != n.id) cons.push_back(n.id);
  }
  tensors.push_back(std::move(t));
  nodes.push_back(std::move(n));
  return tensors.back().id;
}

void OpGraph::validate() const {
  const bool scalar_loss = !nodes.empty() && nodes.back().kind == OpKind::Aten && nodes.back().outputs.size() == 1 &&
                           tensor(nodes.back().outputs[0]).shape.empty();
  if (nodes.empty() || (!is_loss_kind(nodes.back().kind) && !scalar_loss))
    throw std::logic_error(preset + ": the last node must be the loss");
  std::set<std::string> names;
  for (const Node& n : nodes) {
    if (!names.insert(n.name).second) throw std::logic_error("duplicate node name " + n.name);
    if (is_loss_kind(n.kind) && n.id != loss_node()) throw std::logic_error("more than one loss node: " + n.name);
    // Imported calls may create tensors from nothing (arange, zeros).
    if ((n.kind == OpKind::Input && !n.inputs.empty()) ||
        (n.kind != OpKind::Input && n.kind != OpKind::Aten && n.inputs.empty()))
      throw std::logic_error("node " + n.name + ": only Input nodes may have no inputs");
    for (int in : n.inputs)
      if (tensor(in).producer >= n.id) throw std::logic_error("node " + n.name + " reads a tensor produced later");
    for (int out : n.outputs)
      if (tensor(out).consumers.empty() && n.id != loss_node())
        throw std::logic_error("output of " + n.name + " is never used");
    for (const ParamSpec& p : n.params)
      if (p.tied()) {
        if (p.tied_node >= n.id || p.tied_param >= static_cast<int>(nodes[p.tied_node].params.size()))
          throw std::logic_error("node " + n.name + ": bad tie");
        if (nodes[p.tied_node].params[p.tied_param].shape != p.shape)
          throw std::logic_error("node " + n.name + ": tied parameter shape differs");
      }
  }
}

std::vector<int> OpGraph::depths() const {
  std::vector<int> depth(nodes.size(), 0);
  for (const Node& n : nodes)
    for (int in : n.inputs) depth[n.id] = std::max(depth[n.id], depth[tensor(in).producer] + 1);
  return depth;
}

std::vector<int> OpGraph::consumers_of_node(int node) const {
  std::set<int> out;
  for (int t : nodes.at(node).outputs)
    for (int c : tensor(t).consumers) out.insert(c);
  return {out.begin(), out.end()};
}

bool OpGraph::is_data(int t) const { return nodes[tensor(t).producer].kind == OpKind::Input; }

std::vector<CrossingTensor> OpGraph::crossing(int cut) const {
  std::vector<CrossingTensor> out;
  for (const TensorInfo& t : tensors)
    if (t.producer < cut && !t.consumers.empty() && t.consumers.back() >= cut && !is_data(t.id))
      out.push_back({t.id, t.bytes()});
  return out;
}

int64_t OpGraph::crossing_bytes(int cut) const {
  int64_t total = 0;
  for (const CrossingTensor& c : crossing(cut)) total += c.bytes;
  return total;
}

std::vector<int> OpGraph::data_inputs(int begin, int end) const {
  std::set<int> out;
  for (int i = begin; i < end; ++i)
    for (int in : nodes[i].inputs)
      if (is_data(in)) out.insert(in);
  return {out.begin(), out.end()};
}

std::vector<bool> OpGraph::requires_grad() const {
  std::vector<bool> rg(tensors.size(), false);
  for (const Node& n : nodes) {
    bool r = !n.params.empty() && n.kind != OpKind::Input;
    for (int t : n.inputs) r = r || rg[t];
    for (int t : n.outputs) rg[t] = tensor(t).requires_grad >= 0 ? tensor(t).requires_grad == 1 : r;
  }
  return rg;
}

int64_t OpGraph::parameter_count() const {
  int64_t n = 0;
  for (const Node& node : nodes)
    for (const ParamSpec& p : node.params)
      if (!p.tied()) n += numel(p.shape);
  return n;
}

namespace {
void buffers_read(const AtenArg& a, std::set<int>& out) {
  if (a.kind == AtenArg::Kind::Buffer) out.insert(static_cast<int>(a.i));
  for (const AtenArg& item : a.items) buffers_read(item, out);
}
}  // namespace

StageConstant OpGraph::stage_constant(int node) const {
  const Node& n = nodes.at(node);
  if (n.kind == OpKind::Aten) {  // the buffers it reads, loaded once per stage
    std::set<int> read;
    for (const AtenArg& a : n.call.args) buffers_read(a, read);
    StageConstant c;
    for (int b : read) {
      c.key += (c.key.empty() ? "buffers " : " ") + buffers[static_cast<size_t>(b)].name;
      c.bytes += buffers[static_cast<size_t>(b)].bytes();
    }
    return c;
  }
  const Shape& out = tensor(n.outputs[0]).shape;
  if (n.kind == OpKind::CausalMask) {  // bool [S, S]
    const int64_t s = out.back();
    return {"causal_mask " + std::to_string(s), s * s};
  }
  if (n.kind == OpKind::RelPosBias) {  // int64 [Sq, Sk]
    const int64_t sq = out[2], sk = out[3];
    return {"relative_buckets " + std::to_string(sq) + " " + std::to_string(sk) + " " +
                std::to_string(n.attr_int("buckets", 32)) + " " + std::to_string(n.attr_int("max_distance", 128)) +
                " " + std::to_string(n.attr_int("bidirectional", 1) != 0),
            sq * sk * 8};
  }
  return {};
}

int OpGraph::aliased_input(int node, size_t k) const {
  const Node& n = nodes.at(node);
  if (n.kind == OpKind::Reshape || n.kind == OpKind::Transpose) return n.inputs.at(0);
  if (n.kind != OpKind::Aten || k >= n.call.view_of_arg.size()) return -1;
  const int arg = n.call.view_of_arg[k];
  if (arg < 0 || arg >= static_cast<int>(n.call.args.size())) return -1;
  const AtenArg& a = n.call.args[static_cast<size_t>(arg)];
  return a.kind == AtenArg::Kind::Tensor ? n.inputs.at(static_cast<size_t>(a.i)) : -1;
}

std::string OpGraph::fingerprint() const {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  auto mix = [&h](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
    h = (h ^ 0xff) * 1099511628211ULL;
  };
  mix(name_of(precision));
  for (const Node& n : nodes) {
    mix(op_kind_name(n.kind));
    mix(n.call.qualified());
    mix(n.name);
    for (int t : n.inputs) mix(std::to_string(t));
    for (int t : n.outputs) mix(std::to_string(t) + dtype_name(tensor(t).dtype));
    for (const ParamSpec& p : n.params) mix(shape_str(p.shape) + std::to_string(p.tied_node));
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

bool OpGraph::views_weight(int node, size_t k) const {
  const Node& n = nodes.at(node);
  if (n.kind == OpKind::PosEmbedding) return true;
  if (n.kind != OpKind::Aten || k >= n.call.view_of_arg.size()) return false;
  const int arg = n.call.view_of_arg[k];
  if (arg < 0 || arg >= static_cast<int>(n.call.args.size())) return false;
  const AtenArg::Kind kind = n.call.args[static_cast<size_t>(arg)].kind;
  return kind == AtenArg::Kind::Param || kind == AtenArg::Kind::Buffer;
}

std::vector<int> OpGraph::tied_owners() const {
  std::vector<int> owner(nodes.size(), -1);
  for (const Node& n : nodes)
    for (const ParamSpec& ps : n.params)
      if (ps.tied()) {
        int& o = owner[static_cast<size_t>(n.id)];
        if (o >= 0 && o != ps.tied_node)
          throw std::logic_error("node " + n.name + " ties parameters of two nodes; the profile records one");
        o = ps.tied_node;
      }
  return owner;
}

int64_t OpGraph::parameter_bytes(int node) const {
  int64_t b = 0;
  for (const ParamSpec& p : nodes.at(node).params)
    if (!p.tied()) b += p.bytes();
  return b;
}

}  // namespace dawnpiper
