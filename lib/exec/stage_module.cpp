#include "exec/stage_module.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <set>
#include <stdexcept>
#include <tuple>

#include "exec/aten_call.h"
#include "exec/cross_entropy.h"
#include "exec/device_random.h"
#include "exec/lean_ops.h"
#include "exec/weights.h"
#include "graph/layout.h"

namespace dawnpiper {

namespace {
// A matmul whose operands are batches of matrices with the same batch dimensions: at::matmul
// folds them into one bmm, copying an operand whose layout does not fold (graph/layout.h).
bool batched_operands(const OpGraph& graph, const Node& node) {
  if (node.inputs.size() != 2) return false;
  const Shape& a = graph.tensor(node.inputs[0]).shape;
  const Shape& b = graph.tensor(node.inputs[1]).shape;
  return a.size() >= 3 && a.size() == b.size() && std::equal(a.begin(), a.end() - 2, b.begin());
}

at::Tensor init_param(const ParamSpec& spec, uint64_t seed, WeightLoader* weights) {
  at::NoGradGuard no_grad;
  // With --init-from (two weight files) every parameter must come from that checkpoint.
  if (spec.init == Init::File)
    return weights->load(spec.source, spec.aliases, spec.shape, spec.dtype, weights->files() > 1);
  at::Generator gen = at::detail::createCPUGenerator(seed);
  at::Tensor t = at::empty(spec.shape, at::kFloat);
  switch (spec.init) {
    case Init::Normal:
      t.normal_(0.0, spec.scale, gen);
      break;
    case Init::Uniform:
      t.uniform_(-spec.scale, spec.scale, gen);
      break;
    case Init::Zeros:
      t.zero_();
      break;
    case Init::Ones:
      t.fill_(1.0);
      break;
    case Init::File:
      break;
  }
  return t;
}

void buffers_read(const AtenArg& a, std::vector<char>& read) {
  if (a.kind == AtenArg::Kind::Buffer) read[static_cast<size_t>(a.i)] = 1;
  for (const AtenArg& item : a.items) buffers_read(item, read);
}

// T5's bucketing of relative positions (memory - query) into `buckets` buckets.
int64_t t5_bucket(int64_t relative, bool bidirectional, int64_t buckets, int64_t max_distance) {
  int64_t ret = 0;
  int64_t n = 0;
  if (bidirectional) {
    buckets /= 2;
    if (relative > 0) ret += buckets;
    n = std::abs(relative);
  } else {
    n = std::max<int64_t>(-relative, 0);
  }
  const int64_t max_exact = buckets / 2;
  if (n < max_exact) return ret + n;
  double large = static_cast<double>(max_exact) + std::log(static_cast<double>(n) / max_exact) /
                                                      std::log(static_cast<double>(max_distance) / max_exact) *
                                                      static_cast<double>(buckets - max_exact);
  return ret + std::min<int64_t>(static_cast<int64_t>(large), buckets - 1);
}

}  // namespace

StageModule::StageModule(const OpGraph& graph, int begin, int end, uint64_t seed, at::Device device)
    : graph_(&graph), begin_(begin), end_(end), seed_(seed), device_(device) {
  if (begin < 0 || end > graph.size() || begin >= end)
    throw std::logic_error("bad stage range [" + std::to_string(begin) + ", " + std::to_string(end) + ")");
  // Imported models read their weights from files, each rank only its own.
  std::unique_ptr<WeightLoader> weights;
  if (!graph.weight_files.empty()) weights = std::make_unique<WeightLoader>(graph.weight_files);
  make_parameters(weights.get());
  find_inputs_and_releases();
  const std::vector<char> read = prepare_nodes();
  load_buffers(read, weights.get());
}

void StageModule::make_parameters(WeightLoader* weights) {
  const OpGraph& graph = *graph_;
  const int begin = begin_, end = end_;
  const uint64_t seed = seed_;
  const at::Device device = device_;
  // Parameters: owned ones, and tied ones whose owner lies outside the range (held as a copy
  // with the owner's initial values; the runtime keeps copies in sync).
  for (int n = begin; n < end; ++n) {
    const Node& node = graph.nodes[n];
    for (int i = 0; i < static_cast<int>(node.params.size()); ++i) {
      const ParamSpec& spec = node.params[i];
      int owner = spec.tied() ? spec.tied_node : n;
      int owner_index = spec.tied() ? spec.tied_param : i;
      auto key = std::make_pair(owner, owner_index);
      if (param_index_.count(key)) continue;
      const ParamSpec& owner_spec = graph.nodes[owner].params[owner_index];
      StageParameter p;
      p.name = owner_spec.source.empty() ? graph.nodes[owner].name + "." + owner_spec.name : owner_spec.source;
      p.node = owner;
      p.index = owner_index;
      p.tensor = init_param(owner_spec, mix_seed(mix_seed(seed, owner), owner_index), weights)
                     .to(device)
                     .set_requires_grad(true);
      param_index_[key] = static_cast<int>(params_.size());
      params_.push_back(std::move(p));
    }
  }
}

void StageModule::find_inputs_and_releases() {
  const OpGraph& graph = *graph_;
  const int begin = begin_, end = end_;
  // External inputs, outputs and release points.
  std::set<int> external;
  release_after_.assign(end - begin, {});
  for (int n = begin; n < end; ++n)
    for (int t : graph.nodes[n].inputs)
      if (graph.tensor(t).producer < begin || graph.is_data(t)) external.insert(t);
  external_inputs_.assign(external.begin(), external.end());
  for (const TensorInfo& t : graph.tensors) {
    bool produced_here = t.producer >= begin && t.producer < end;
    if (!produced_here && !external.count(t.id)) continue;
    int last_local = -1;
    bool read_later = false;
    for (int c : t.consumers) {
      if (c >= begin && c < end) last_local = std::max(last_local, c);
      if (c >= end) read_later = true;
    }
    if (read_later) {  // later stages read it: keep it (and send it, if it is ours)
      if (produced_here && !graph.is_data(t.id)) outputs_.push_back(t.id);
      continue;
    }
    if (produced_here && t.consumers.empty()) continue;  // the loss: the caller reads it
    if (last_local >= 0) release_after_[last_local - begin].push_back(t.id);
  }
}

// Each node's kernel (imported ops), reshape copies, internal-buffer slots and constant key; the
// graph's buffers the range reads.
std::vector<char> StageModule::prepare_nodes() {
  const OpGraph& graph = *graph_;
  const int begin = begin_, end = end_;
  const std::vector<Strides> strides = tensor_strides(graph);
  reshape_copies_.assign(end - begin, 0);
  internal_slots_.assign(static_cast<size_t>(end - begin), {});
  constant_keys_.assign(end - begin, {});
  kernels_.resize(static_cast<size_t>(end - begin));
  std::vector<char> read(graph.buffers.size(), 0);
  for (int n = begin; n < end; ++n) {
    const Node& node = graph.nodes[n];
    if (node.kind == OpKind::Aten) {
      kernels_[static_cast<size_t>(n - begin)] = std::make_unique<AtenKernel>(node);
      for (const AtenArg& a : node.call.args) buffers_read(a, read);
    }
    if (node.kind == OpKind::Reshape)
      reshape_copies_[n - begin] =
          !reshape_is_view(graph, strides, node.inputs[0], graph.tensor(node.outputs[0]).shape);
    auto add_slot = [&](int copy_of) {
      internal_slots_[static_cast<size_t>(n - begin)].emplace_back(
          copy_of, static_cast<int>(graph.tensors.size()) + internal_count_++);
    };
    if (node.kind == OpKind::Dropout || node.kind == OpKind::CrossEntropy || node.kind == OpKind::MaxPool2d)
      add_slot(-1);
    if (node.kind == OpKind::MatMul && batched_operands(graph, node))
      for (int in : matmul_copied_inputs(graph, strides, n))
        if (std::count(node.inputs.begin(), node.inputs.end(), in) == 1) add_slot(in);
    constant_keys_[n - begin] = graph.stage_constant(n).key;
  }
  return read;
}

void StageModule::load_buffers(const std::vector<char>& read, WeightLoader* weights) {
  const OpGraph& graph = *graph_;
  buffers_.resize(graph.buffers.size());
  for (size_t i = 0; i < read.size(); ++i)
    if (read[i]) {
      const BufferSpec& b = graph.buffers[i];
      buffers_[i] = weights->load(b.name, {}, b.shape, b.dtype).to(device_);
    }
}

StageModule::~StageModule() = default;
StageModule::StageModule(StageModule&&) noexcept = default;

int64_t StageModule::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.tensor.numel();
  return n;
}

std::vector<int> StageModule::parameters_read(int node) const {
  std::vector<int> read;
  const std::vector<ParamSpec>& params = graph_->nodes[node].params;
  for (int i = 0; i < static_cast<int>(params.size()); ++i) {
    const ParamSpec& spec = params[i];
    read.push_back(
        param_index_.at(spec.tied() ? std::make_pair(spec.tied_node, spec.tied_param) : std::make_pair(node, i)));
  }
  return read;
}

at::Tensor StageModule::param(int node, int index) const {
  const ParamSpec& spec = graph_->nodes[node].params[index];
  auto key = spec.tied() ? std::make_pair(spec.tied_node, spec.tied_param) : std::make_pair(node, index);
  const int i = param_index_.at(key);
  if (gate_) gate_(i);
  return params_[static_cast<size_t>(i)].tensor;
}

at::Tensor StageModule::causal_mask(const Node& node, int64_t size) const {
  at::Tensor& m = constants_[constant_keys_[node.id - begin_]];
  if (!m.defined()) m = at::ones({size, size}, at::TensorOptions().dtype(at::kBool)).triu(1).to(device_);
  return m;
}

at::Tensor StageModule::relative_buckets(const Node& node, int64_t sq, int64_t sk) const {
  const int64_t buckets = node.attr_int("buckets", 32);
  const int64_t max_distance = node.attr_int("max_distance", 128);
  const bool bidirectional = node.attr_int("bidirectional", 1) != 0;
  at::Tensor& t = constants_[constant_keys_[node.id - begin_]];
  if (t.defined()) return t;
  std::vector<int64_t> ids(sq * sk);
  for (int64_t q = 0; q < sq; ++q)
    for (int64_t k = 0; k < sk; ++k) ids[q * sk + k] = t5_bucket(k - q, bidirectional, buckets, max_distance);
  t = at::tensor(ids, at::kLong).view({sq, sk}).to(device_);
  return t;
}

void StageModule::forward(TensorEnv& env, const RunContext& ctx, const std::function<void(int node)>& before_node,
                          const std::function<void(int node, TensorEnv& env)>& after_node) const {
  for (int t : external_inputs_)
    if (!env.at(t).defined()) throw std::logic_error("stage input " + graph_->tensor(t).name + " was not provided");
  for (int n = begin_; n < end_; ++n) {
    if (before_node) before_node(n);
    run_node(n, env, ctx);
    if (after_node) after_node(n, env);
    for (int t : release_after_[n - begin_]) env[t] = at::Tensor();
    for (const auto& [copy_of, slot] : internal_slots_[static_cast<size_t>(n - begin_)])
      if (static_cast<size_t>(slot) < env.size()) env[static_cast<size_t>(slot)] = at::Tensor();
  }
}

int StageModule::internal_slot(int node, int copy_of) const {
  if (node < begin_ || node >= end_) return -1;
  for (const auto& [copied, slot] : internal_slots_[static_cast<size_t>(node - begin_)])
    if (copied == copy_of) return slot;
  return -1;
}

void StageModule::expose(TensorEnv& env, int node, int copy_of, const at::Tensor& buffer) const {
  const int slot = internal_slot(node, copy_of);
  if (slot >= 0 && static_cast<size_t>(slot) < env.size()) env[static_cast<size_t>(slot)] = buffer;
}

// A node's inputs as read from the environment.
struct NodeInputs {
  const Node& node;
  const TensorEnv& env;
  const at::Tensor& operator()(size_t i) const { return env[node.inputs.at(i)]; }
};

namespace {

// Ops without parameters or per-stage state: a function of their inputs and attributes.
at::Tensor stateless_op(const Node& node, const NodeInputs& in) {
  switch (node.kind) {
    case OpKind::Gelu:
      return at::gelu(in(0));
    case OpKind::Relu:
      return at::relu(in(0));
    case OpKind::Tanh:
      return at::tanh(in(0));
    case OpKind::Erf:
      return at::erf(in(0));
    case OpKind::Sqrt:
      return at::sqrt(in(0));
    case OpKind::Softmax:
      return softmax_last_dim(in(0));
    case OpKind::Mean:
      return in(0).mean(-1, true);
    case OpKind::Scale:
      return in(0) * node.attr_real("factor", 1.0);
    case OpKind::Affine: {
      const double scale = node.attr_real("scale", 1.0), shift = node.attr_real("shift", 0.0);
      return scale == 1.0 ? in(0) + shift : in(0) * scale + shift;
    }
    case OpKind::Add: {
      at::Tensor out = in(0) + in(1);
      for (size_t i = 2; i < node.inputs.size(); ++i) out = out + in(i);
      return out;
    }
    case OpKind::Mul:
      return at::mul(in(0), in(1));
    case OpKind::Sub:
      return at::sub(in(0), in(1));
    case OpKind::Div:
      return at::div(in(0), in(1));
    case OpKind::Transpose:
      return in(0).permute(node.attr_ints("dims"));
    case OpKind::AvgPool2d: {
      int64_t k = node.attr_int("kernel", 3), s = node.attr_int("stride", 1), p = node.attr_int("padding", 0);
      return at::avg_pool2d(in(0), {k, k}, {s, s}, {p, p}, false, /*count_include_pad=*/false);
    }
    case OpKind::Concat: {
      std::vector<at::Tensor> xs;
      for (size_t i = 0; i < node.inputs.size(); ++i) xs.push_back(in(i));
      return at::cat(xs, node.attr_int("dim", 1));
    }
    case OpKind::GlobalAvgPool:
      return in(0).mean({2, 3});
    default:
      throw std::logic_error(std::string("stateless_op: ") + op_kind_name(node.kind) + " is not stateless");
  }
}

}  // namespace

void StageModule::run_node(int n, TensorEnv& env, const RunContext& ctx) const {
  const Node& node = graph_->nodes[n];
  const NodeInputs in{node, env};
  at::Tensor out;
  switch (node.kind) {
    case OpKind::Input:  // the data loader filled env (external_inputs() lists what is read)
      return;
    case OpKind::Aten:
      run_aten(node, env, ctx);
      return;
    case OpKind::Dropout:
      out = ctx.eval ? in(0) : dropout(node, in(0), ctx, env);
      break;
    case OpKind::MatMul:
      out = matmul(node, in, env);
      break;
    case OpKind::CrossEntropy:
      out = cross_entropy(node, in, env);
      break;
    case OpKind::MaxPool2d: {
      // at::max_pool2d's training path, so that the indices its backward saves are held here.
      int64_t k = node.attr_int("kernel", 3), s = node.attr_int("stride", 1), p = node.attr_int("padding", 0);
      at::Tensor indices;
      std::tie(out, indices) = at::max_pool2d_with_indices(in(0), {k, k}, {s, s}, {p, p});
      expose(env, node.id, -1, indices);
      break;
    }
    case OpKind::Reshape:
      out = in(0).reshape(node.attr_ints("shape"));
      if (reshape_copies_[n - begin_] && out.is_alias_of(in(0))) out = out.clone();
      break;
    case OpKind::CausalMask:
      out = in(0).masked_fill(causal_mask(node, in(0).size(-1)), -std::numeric_limits<float>::infinity());
      break;
    case OpKind::Embedding:
    case OpKind::PosEmbedding:
    case OpKind::Linear:
    case OpKind::LayerNorm:
    case OpKind::RMSNorm:
    case OpKind::ScaleShift:
    case OpKind::RelPosBias:
    case OpKind::Conv2d:
    case OpKind::BatchNorm2d:
    case OpKind::LinearCrossEntropy:
      out = parametric_op(node, in);
      break;
    default:
      out = stateless_op(node, in);
  }
  env[node.outputs[0]] = std::move(out);
}

at::Tensor StageModule::dropout(const Node& node, const at::Tensor& x, const RunContext& ctx, TensorEnv& env) const {
  const double p = node.attr_real("p", 0.1);
  const uint64_t s = mix_seed(mix_seed(mix_seed(seed_, 0x5eed0000ULL + node.id), ctx.step), ctx.micro_batch);
  // Drawn where it is used, straight into the mask's booleans (no float draw, no copy), from a
  // generator of its own: every schedule and a recomputation see the same mask on one device.
  at::Tensor keep =
      at::empty(x.sizes(), x.options().dtype(at::kBool)).bernoulli_(1.0 - p, seeded_generator(device_, s));
  expose(env, node.id, -1, keep);  // what the multiplication saves for its backward
  return at::mul(x, keep) * (1.0 / (1.0 - p));
}

at::Tensor StageModule::matmul(const Node& node, const NodeInputs& in, TensorEnv& env) const {
  // The operand copies at::matmul would make inside, made here: the same bytes, saved by the
  // same bmm, but held where the evictor can reach them.
  at::Tensor operands[2] = {in(0), in(1)};
  for (size_t i = 0; i < 2; ++i) {
    const int id = node.inputs[i];
    if (internal_slot(node.id, id) < 0) continue;
    at::Tensor copy = operands[i].contiguous();
    if (copy.is_same(operands[i])) continue;  // arrived contiguous (received): no copy
    expose(env, node.id, id, copy);
    operands[i] = copy;
  }
  return at::matmul(operands[0], operands[1]);
}

at::Tensor StageModule::cross_entropy(const Node& node, const NodeInputs& in, TensorEnv& env) const {
  // Where this node is the logits' last reader here and no later stage reads them, the env's
  // handle moves into the call; if no other is left (no backward saved them, the evictor keeps
  // none to recompute from) and they are contiguous (rows of them are their memory), the
  // log-probabilities are written over them. The replay (plan/stage_replay_walk.cpp,
  // NodeClass::InPlaceLoss) counts it by the same references.
  const int id = node.inputs[0];
  const std::vector<int>& released = release_after_[static_cast<size_t>(node.id - begin_)];
  const at::Tensor logits =
      std::find(released.begin(), released.end(), id) != released.end() ? std::move(env[id]) : in(0);
  at::Tensor log_probs;
  const bool overwrite = logits.is_contiguous() && sole_owner(logits);
  const at::Tensor loss = dawnpiper::cross_entropy(logits, in(1), overwrite, &log_probs);
  expose(env, node.id, -1, log_probs);
  return loss;
}

at::Tensor StageModule::parametric_op(const Node& node, const NodeInputs& in) const {
  // bf16: parameters are cast at each use (autograd carries fp32 gradients to the masters).
  const bool bf16 = graph_->precision == Precision::Bf16;
  auto weight = [&](int i) {
    at::Tensor p = param(node.id, i);
    return bf16 ? p.to(at::kBFloat16) : p;
  };
  auto bias = [&](int i) { return node.params.size() > static_cast<size_t>(i) ? weight(i) : at::Tensor(); };
  switch (node.kind) {
    case OpKind::Embedding:
      return at::embedding(weight(0), in(0));
    case OpKind::PosEmbedding:
      return weight(0).narrow(0, 0, in(0).size(1));
    case OpKind::Linear: {
      if (!node.ints.count("rows")) return at::linear(in(0), weight(0), bias(1));
      // A chunk of a tied projection: its rows are narrowed before any bf16 cast, so only they
      // are copied.
      const std::vector<int64_t>& rows = node.attr_ints("rows");
      at::Tensor w = param(node.id, 0).narrow(0, rows[0], rows[1] - rows[0]);
      return at::linear(in(0), bf16 ? w.to(at::kBFloat16) : w, bias(1));
    }
    case OpKind::LinearCrossEntropy: {
      // The parameters as they are: the node computes in the hidden states' dtype itself (bf16
      // zoo graphs and imported autocast ones alike, as scripts/dawnpiper_ops.py does) and
      // sums their gradients in theirs.
      const at::Tensor b = node.params.size() > 1 ? param(node.id, 1) : at::Tensor();
      return linear_cross_entropy(in(0), param(node.id, 0), b, in(1), node.attr_int("chunk_tokens", 0));
    }
    case OpKind::LayerNorm:
      return at::layer_norm(in(0), {in(0).size(-1)}, weight(0), weight(1), node.attr_real("eps", 1e-5));
    case OpKind::RMSNorm:  // the fp32 master weight: cast inside, for the call only
      return rms_norm(in(0), param(node.id, 0), node.attr_real("eps", 1e-6));
    case OpKind::ScaleShift:
      return at::addcmul(weight(1), in(0), weight(0));
    case OpKind::RelPosBias: {
      const Shape& s = graph_->tensor(node.outputs[0]).shape;  // [1, heads, Sq, Sk]
      // Contiguous, as the profile and the planner assume of every non-view op's output (and as
      // a transport sends it).
      return at::embedding(weight(0), relative_buckets(node, s[2], s[3])).permute({2, 0, 1}).unsqueeze(0).contiguous();
    }
    case OpKind::Conv2d:
      return at::conv2d(in(0), weight(0), bias(1), node.attr_ints("stride"), node.attr_ints("padding"));
    case OpKind::BatchNorm2d:
      return at::batch_norm(in(0), weight(0), weight(1), at::Tensor(), at::Tensor(),
                            /*training=*/true, 0.1, node.attr_real("eps", 1e-5), true);
    default:
      throw std::logic_error(std::string("parametric_op: ") + op_kind_name(node.kind) + " has no parameters");
  }
}

void StageModule::run_aten(const Node& node, TensorEnv& env, const RunContext& ctx) const {
  const AtenKernel& kernel = *kernels_[static_cast<size_t>(node.id - begin_)];
  if (ctx.eval && node.call.op.find("dropout") != std::string::npos && node.call.result_index == std::vector<int>{0}) {
    env[static_cast<size_t>(node.outputs[0])] = env[static_cast<size_t>(node.inputs.at(0))];  // evaluation: no dropout
    return;
  }
  if (kernel.seeded()) {
    // Random ops draw from the device's generator, seeded per (node, step, micro-batch) as the
    // zoo's dropout is: a recomputation and every schedule see the same numbers.
    at::Generator gen = at::globalContext().defaultGenerator(device_);  // a handle to it
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(
        mix_seed(mix_seed(mix_seed(seed_, 0x5eed0000ULL + static_cast<uint64_t>(node.id)), ctx.step), ctx.micro_batch));
  }
  std::vector<at::Tensor> outs = kernel.call(
      node,
      [&](const AtenArg& a) -> at::Tensor {
        switch (a.kind) {
          case AtenArg::Kind::Tensor:
            return env[static_cast<size_t>(node.inputs[static_cast<size_t>(a.i)])];
          case AtenArg::Kind::Param:
            return param(node.id, static_cast<int>(a.i));
          default:
            return buffers_[static_cast<size_t>(a.i)];
        }
      },
      device_, /*no_dropout=*/ctx.eval);
  for (size_t k = 0; k < node.outputs.size(); ++k) env[static_cast<size_t>(node.outputs[k])] = std::move(outs[k]);
}

}  // namespace dawnpiper
