#include "profile/analytic.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#include "graph/layout.h"
#include "profile/profile_builder.h"
#include "util/error.h"
#include "util/units.h"

namespace dawnpiper {

DeviceSpec device_spec(const std::string& name) {
  DeviceSpec s;
  if (name == "a100-40gb") {
    // FP32 19.5 TFLOP/s and 1555 GB/s peak, at 80% achievable; PCIe 4.0 x16 to the host;
    // NVLink 3 between GPUs.
    s = {"a100-40gb", 40LL << 30, 0.8 * 19.5e12, 0.8 * 1555e9, 24e9, 240e9, 5e-6};
    return s;
  }
  if (name == "h100-80gb") {
    // SXM: FP32 67 TFLOP/s, 3.35 TB/s, PCIe 5.0 x16, NVLink 4.
    s = {"h100-80gb", 80LL << 30, 0.8 * 67e12, 0.8 * 3350e9, 50e9, 360e9, 4e-6};
    return s;
  }
  std::ifstream in(name);
  if (!in) throw ConfigError("unknown device spec '" + name + "' (use a100-40gb, h100-80gb or a spec file)");
  std::map<std::string, std::string> kv;
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    auto trim = [](std::string x) {
      x.erase(0, x.find_first_not_of(" \t"));
      x.erase(x.find_last_not_of(" \t\r") + 1);
      return x;
    };
    kv[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  auto need = [&](const std::string& key) {
    auto it = kv.find(key);
    if (it == kv.end()) throw ConfigError("device spec '" + name + "' lacks '" + key + "'");
    return it->second;
  };
  auto number = [&](const std::string& key) {
    try {
      return std::stod(need(key));
    } catch (const std::invalid_argument&) {
      throw ConfigError("device spec '" + name + "': '" + key + "' is not a number");
    }
  };
  s.name = kv.count("name") ? kv["name"] : name;
  s.memory_bytes = parse_bytes(need("memory"), "device spec memory");
  s.flops = number("flops");
  s.bandwidth = number("bandwidth");
  s.host_bandwidth = number("host_bandwidth");
  s.link_bandwidth = number("link_bandwidth");
  if (kv.count("kernel_overhead_us")) s.kernel_overhead_s = number("kernel_overhead_us") * 1e-6;
  if (s.flops <= 0 || s.bandwidth <= 0 || s.host_bandwidth <= 0 || s.link_bandwidth <= 0)
    throw ConfigError("device spec '" + name + "': rates must be positive");
  return s;
}

namespace {

// What one op costs and keeps, by kind: mirrors LibTorch autograd (checked against the
// measured profiler in tests/profile).
struct OpFacts {
  std::vector<int> saved_inputs;  // input positions whose tensors the backward keeps
  bool saves_output = false;
  int64_t internal_bytes = 0;   // buffers only autograd holds
  bool output_is_view = false;  // alias of input 0
  bool output_is_param_view = false;
  double flops = 0, bwd_flops = 0;
  double bytes = 0, bwd_bytes = 0;
  int kernels = 1, bwd_kernels = 1;
  // Imported (Aten) nodes: per output, the input tensor whose storage it shares (-1: its own);
  // known is false for operators without a formula (then what autograd keeps is measured).
  std::vector<int> output_alias;
  bool known = true;
  int64_t fwd_workspace = 0, bwd_workspace = 0;  // transient bytes (zero where none is modelled)
};

// The input position of Aten argument j, or -1 when it is not a graph tensor.
int arg_input(const Node& n, size_t j) {
  if (j >= n.call.args.size() || n.call.args[j].kind != AtenArg::Kind::Tensor) return -1;
  return static_cast<int>(n.call.args[j].i);
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// Formulas for the ATen operators Hugging Face models are made of: what the backward keeps (as
// PyTorch's derivatives.yaml says) and a roofline cost. Views cost nothing and share storage.
// A product of `a` ([..., k]) with a [k, n_out] operand.
double matmul_flops(const Shape& a, int64_t n_out) {
  const double k = static_cast<double>(a.back());
  return 2.0 * static_cast<double>(numel(a)) / k * k * static_cast<double>(n_out);
}

// aten::addmm, mm, bmm and matmul: both operands kept (matmul: a copy of each operand whose
// layout does not fold, instead of it).
void product_facts(const OpGraph& g, const std::vector<Strides>& st, const Node& n, OpFacts& f) {
  const std::string& op = n.call.op;
  const TensorInfo& out = g.tensor(n.outputs[0]);
  auto save = [&](int pos) {
    if (pos >= 0) f.saved_inputs.push_back(pos);
  };
  const bool addmm = op == "aten::addmm";
  const int a = arg_input(n, addmm ? 1 : 0), b = arg_input(n, addmm ? 2 : 1);
  save(a), save(b);
  const Shape& as = a >= 0 ? g.tensor(n.inputs.at(static_cast<size_t>(a))).shape : out.shape;
  f.flops = matmul_flops(as, out.shape.back());
  if (op == "aten::matmul") {  // operands whose layout does not fold are copied, the copy kept
    const std::vector<int> copied = matmul_copied_inputs(g, st, n.id);
    f.saved_inputs.clear();
    for (int pos : {a, b})
      if (pos >= 0 && std::find(copied.begin(), copied.end(), n.inputs[static_cast<size_t>(pos)]) == copied.end())
        save(pos);
    for (int t : copied) f.internal_bytes += g.tensor(t).bytes();
  }
}

void attention_facts(const OpGraph& g, const Node& n, const std::vector<bool>& rg, OpFacts& f) {
  auto save = [&](int pos) {
    if (pos >= 0) f.saved_inputs.push_back(pos);
  };
  auto shape = [&](int pos) -> const Shape& { return g.tensor(n.inputs.at(static_cast<size_t>(pos))).shape; };
  // Fused attention keeps q, k, v, the output and the log-sum-exp per row (and a boolean mask
  // as a float bias); backward recomputes the probabilities.
  for (int j = 0; j < 3; ++j) save(arg_input(n, static_cast<size_t>(j)));
  f.saves_output = true;
  const Shape& q = shape(arg_input(n, 0));
  const Shape& k = shape(arg_input(n, 1));
  const double rows = static_cast<double>(numel(q)) / static_cast<double>(q.back());
  f.internal_bytes = static_cast<int64_t>(rows) * 4;
  const int mask = arg_input(n, 3);
  if (mask >= 0) {
    const TensorInfo& m = g.tensor(n.inputs[static_cast<size_t>(mask)]);
    if (m.dtype == DType::Bool)
      f.internal_bytes += numel(m.shape) * 4;
    else
      save(mask);
    // A bias that needs a gradient (T5's position bias): the memory-efficient kernel's
    // backward writes it at the full [B, heads, Sq, Sk] (Sk padded to 16) before summing it
    // down to the bias's shape.
    if (rg[static_cast<size_t>(n.inputs[static_cast<size_t>(mask)])]) {
      const int64_t sk = (k[k.size() - 2] + 15) / 16 * 16;
      f.bwd_workspace = static_cast<int64_t>(rows) * sk * dtype_size(m.dtype);
    }
  }
  f.flops = 4.0 * rows * static_cast<double>(k[k.size() - 2]) * static_cast<double>(q.back());
  f.bwd_flops = 2.5 * f.flops;
  f.kernels = 1, f.bwd_kernels = 2;
}

void mul_div_facts(const Node& n, const std::vector<bool>& rg, OpFacts& f) {
  const std::string& op = n.call.op;
  auto save = [&](int pos) {
    if (pos >= 0) f.saved_inputs.push_back(pos);
  };
  // mul: each factor for the other's gradient; div: the divisor for the dividend's, both for
  // the divisor's. A number factor is kept as a wrapped scalar.
  const int a = arg_input(n, 0), b = arg_input(n, 1);
  auto grad = [&](size_t j, int pos) {  // the factor needs a gradient (a parameter always does)
    if (n.call.args[j].kind == AtenArg::Kind::Param) return true;
    return pos >= 0 && rg[static_cast<size_t>(n.inputs[static_cast<size_t>(pos)])];
  };
  const bool ga = grad(0, a), gb = grad(1, b);
  if (gb && a >= 0) save(a);
  if (ga || (op == "aten::div" && gb)) {
    if (b >= 0)
      save(b);
    else if (n.call.args[1].kind != AtenArg::Kind::Param)
      f.internal_bytes += 8;
  }
}

void aten_facts(const OpGraph& g, const std::vector<Strides>& st, const Node& n, const std::vector<bool>& rg,
                OpFacts& f) {
  const std::string& op = n.call.op;
  const TensorInfo& out = g.tensor(n.outputs[0]);
  f.output_alias.assign(n.outputs.size(), -1);
  bool any_grad = false;
  for (int t : n.outputs) any_grad = any_grad || rg[static_cast<size_t>(t)];
  auto shape = [&](int pos) -> const Shape& { return g.tensor(n.inputs.at(static_cast<size_t>(pos))).shape; };
  auto save = [&](int pos) {
    if (pos >= 0) f.saved_inputs.push_back(pos);
  };
  // Views of parameters and buffers allocate nothing.
  if (g.views_weight(n.id, 0)) {
    f.output_is_param_view = true;
    f.kernels = f.bwd_kernels = 0, f.bytes = f.bwd_bytes = 0;
    return;
  }
  // Views: every output that may share an input's storage, and reshapes that can.
  bool view = false;
  for (size_t k = 0; k < n.outputs.size(); ++k) {
    const int src = g.aliased_input(n.id, k);
    if (src < 0) continue;
    const bool is_view = op != "aten::reshape" || reshape_is_view(g, st, src, g.tensor(n.outputs[k]).shape);
    if (is_view) f.output_alias[k] = src, view = true;
  }
  if (view) {
    f.kernels = f.bwd_kernels = 0, f.bytes = f.bwd_bytes = 0;
    return;
  }
  if (!any_grad) {  // integer and mask arithmetic, constants: a forward kernel, nothing kept
    f.bwd_bytes = 0, f.bwd_kernels = 0;
    return;
  }
  if (op == "aten::linear") {
    save(arg_input(n, 0)), save(arg_input(n, 1));
    f.flops = matmul_flops(shape(arg_input(n, 0)), out.shape.back());
  } else if (op == "aten::addmm" || op == "aten::mm" || op == "aten::bmm" || op == "aten::matmul") {
    product_facts(g, st, n, f);
  } else if (op == "aten::scaled_dot_product_attention") {
    attention_facts(g, n, rg, f);
    return;
  } else if (op == "aten::layer_norm" || op == "aten::native_layer_norm" || op == "aten::group_norm" ||
             op == "aten::rms_norm") {
    save(arg_input(n, 0));
    f.internal_bytes = (numel(out.shape) / std::max<int64_t>(1, out.shape.empty() ? 1 : out.shape.back())) * 8;
  } else if (op == "aten::embedding") {
    save(arg_input(n, 1));
  } else if (op == "aten::softmax" || op == "aten::_softmax" || op == "aten::log_softmax" ||
             op == "aten::_log_softmax" || op == "aten::relu" || op == "aten::tanh" || op == "aten::sigmoid" ||
             op == "aten::exp" || op == "aten::rsqrt" || op == "aten::sqrt") {
    f.saves_output = true;
  } else if (op == "aten::gelu" || op == "aten::silu" || op == "aten::log" || op == "aten::pow" || op == "aten::erf" ||
             op == "aten::sin" || op == "aten::cos" || op == "aten::abs") {
    save(arg_input(n, 0));
  } else if (op == "aten::mul" || op == "aten::div") {
    mul_div_facts(n, rg, f);
  } else if (op == "aten::native_dropout" || op == "aten::dropout") {
    f.internal_bytes = numel(out.shape);  // the boolean mask
    f.kernels = 3;
  } else if (op == "aten::cross_entropy_loss") {
    save(arg_input(n, 1));
    f.internal_bytes = g.tensor(n.inputs.at(static_cast<size_t>(arg_input(n, 0)))).bytes() + 4;
    f.kernels = 2;
  } else if (op == "aten::where" || op == "aten::masked_fill") {
    save(arg_input(n, op == "aten::where" ? 0 : 1));  // the condition / mask
  } else if (op == "aten::index" || op == "aten::gather") {
    save(arg_input(n, op == "aten::gather" ? 2 : 1));
  } else if (op == "aten::add" || op == "aten::sub" || op == "aten::neg" || op == "aten::mean" || op == "aten::sum" ||
             op == "aten::cat" || op == "aten::clone" || op == "aten::contiguous" || op == "aten::_to_copy" ||
             op == "aten::to" || op == "aten::expand" || op == "aten::pad" || op == "aten::constant_pad_nd" ||
             op == "aten::slice_scatter" || op == "aten::select_scatter" || op == "aten::copy" ||
             starts_with(op, "aten::_unsafe_view") || op == "aten::stack" || op == "aten::repeat") {
    // Gradients need shapes only.
  } else {
    f.known = false;
    for (size_t i = 0; i < n.inputs.size(); ++i)  // without a measurement: every float input kept
      if (is_floating(g.tensor(n.inputs[i]).dtype)) f.saved_inputs.push_back(static_cast<int>(i));
  }
  f.bwd_flops = 2 * f.flops;
}

// Linear, MatMul and Conv2d: the ops that carry the flops.
void contraction_facts(const OpGraph& g, const std::vector<Strides>& st, const Node& n, OpFacts& f) {
  const TensorInfo& out = g.tensor(n.outputs[0]);
  auto in_shape = [&](size_t i) -> const Shape& { return g.tensor(n.inputs.at(i)).shape; };
  switch (n.kind) {
    case OpKind::Linear: {
      f.saved_inputs = {0};
      const double k = static_cast<double>(in_shape(0).back());
      f.flops = 2.0 * static_cast<double>(numel(in_shape(0))) / k * k * static_cast<double>(out.shape.back());
      f.bytes += static_cast<double>(g.parameter_bytes(n.id));
      if (n.ints.count("rows")) {  // a chunk of a tied projection
        const ParamSpec& w = n.params[0];
        const double whole = static_cast<double>(w.bytes());
        const double rows = whole / static_cast<double>(w.shape[0]) * static_cast<double>(out.shape.back());
        // Reads its rows; its backward writes their gradient, fills the whole weight's with
        // zeros around it, and sums that into the weight's gradient (read, read, write).
        f.bytes += rows;
        f.bwd_bytes += 2 * rows + 4 * whole;
      }
      break;
    }
    case OpKind::MatMul: {
      // The backward keeps each operand, or the contiguous copy made of it.
      const std::vector<int> copied = matmul_copied_inputs(g, st, n.id);
      for (int i = 0; i < 2; ++i) {
        if (std::find(copied.begin(), copied.end(), n.inputs[i]) == copied.end())
          f.saved_inputs.push_back(i);
        else
          f.internal_bytes += g.tensor(n.inputs[i]).bytes();
      }
      const Shape& a = in_shape(0);
      const double m = static_cast<double>(a[a.size() - 2]), k = static_cast<double>(a.back());
      const double batch = static_cast<double>(numel(a)) / (m * k);
      f.flops = 2.0 * batch * m * k * static_cast<double>(out.shape.back());
      break;
    }
    case OpKind::Conv2d: {
      f.saved_inputs = {0};
      const Shape& w = n.params[0].shape;  // [Co, Ci, kh, kw]
      f.flops = 2.0 * static_cast<double>(numel(out.shape)) * static_cast<double>(w[1] * w[2] * w[3]);
      break;
    }
    default:
      throw std::logic_error(std::string("contraction_facts: ") + op_kind_name(n.kind));
  }
  f.bwd_flops = 2 * f.flops;
}

// What a zoo op keeps for its backward and how many kernels it runs (flops aside).
void zoo_facts(const OpGraph& g, const std::vector<Strides>& st, const Node& n, OpFacts& f) {
  const TensorInfo& out = g.tensor(n.outputs[0]);
  const int64_t rows = out.shape.empty() ? 1 : numel(out.shape) / out.shape.back();
  auto view = [&f] { f.kernels = 0, f.bytes = 0; };
  switch (n.kind) {
    case OpKind::Input:
      f.kernels = f.bwd_kernels = 0;
      f.bytes = f.bwd_bytes = 0;
      break;
    case OpKind::PosEmbedding:
      f.output_is_param_view = true;
      view();
      break;
    case OpKind::Reshape:
      f.output_is_view = reshape_is_view(g, st, n.inputs[0], out.shape);
      if (f.output_is_view) view();
      break;
    case OpKind::Transpose:
      f.output_is_view = true;
      view();
      break;
    case OpKind::Linear:
    case OpKind::MatMul:
    case OpKind::Conv2d:
      contraction_facts(g, st, n, f);
      break;
    case OpKind::Embedding:  // the ids
    case OpKind::Gelu:
    case OpKind::Erf:
    case OpKind::ScaleShift:
    case OpKind::AvgPool2d:
      f.saved_inputs = {0};
      break;
    case OpKind::Mul:
    case OpKind::Div:
      f.saved_inputs = {0, 1};
      break;
    case OpKind::Relu:
    case OpKind::Tanh:
    case OpKind::Sqrt:
      f.saves_output = true;
      break;
    case OpKind::Softmax:  // exec/lean_ops.cpp: fp32 backward in three passes, with row sums
      f.saves_output = true;
      if (g.precision == Precision::Fp32) {
        f.bwd_bytes = 3.5 * f.bytes;
        f.bwd_kernels = 3;
        f.bwd_workspace = rows * 4;
      }
      break;
    case OpKind::LayerNorm:
      f.saved_inputs = {0};
      f.internal_bytes = rows * 8;
      break;
    case OpKind::RMSNorm:  // exec/lean_ops.cpp: x and an fp32 factor per row
      f.saved_inputs = {0};
      f.internal_bytes = rows * 4;
      // forward: the rows' norms, the product, the weight in place; backward: g * x * r, its two
      // reductions (one after multiplying by w in place), the input's gradient and two passes
      f.bytes *= 2.5;
      f.bwd_bytes = 16 * static_cast<double>(out.bytes());
      f.kernels = 6;
      f.bwd_kernels = 9;
      f.bwd_workspace = rows * 8;
      break;
    case OpKind::Dropout:
      f.internal_bytes = numel(out.shape);  // bool mask
      f.kernels = 3;
      break;
    case OpKind::BatchNorm2d:
      f.saved_inputs = {0};
      f.internal_bytes = out.shape[1] * 8;
      f.kernels = 2;
      break;
    case OpKind::MaxPool2d:
      f.saved_inputs = {0};
      f.internal_bytes = numel(out.shape) * 8;
      break;
    case OpKind::CrossEntropy:
      f.saved_inputs = {1};  // the labels
      // the log-softmax of the logits (fp32, also in bf16 runs), which its backward overwrites
      // with the logits' gradient (exec/cross_entropy.h)
      f.internal_bytes = numel(g.tensor(n.inputs[0]).shape) * 4;
      f.kernels = 2;
      break;
    case OpKind::LinearCrossEntropy: {
      // exec/cross_entropy.cpp: per chunk of positions, a projection, the fp32 logits'
      // log-sum-exp (one more buffer of their size) and the target's logit; backward recomputes
      // the logits, turns them into the gradient in place and runs the two products.
      const Shape& hidden = g.tensor(n.inputs[0]).shape;
      const double positions = static_cast<double>(numel(hidden) / hidden.back());
      f.saved_inputs = {0, 1};                                     // hidden states, labels
      f.internal_bytes = static_cast<int64_t>(positions) * 4 + 4;  // a log-sum-exp per position, the count
      const double classes = static_cast<double>(n.params[0].shape[0]);
      const double dim = static_cast<double>(hidden.back());
      const int64_t chunk = std::min<int64_t>(n.attr_int("chunk_tokens", 1), static_cast<int64_t>(positions));
      const int64_t chunks = (static_cast<int64_t>(positions) + chunk - 1) / chunk;
      const int64_t logits = chunk * static_cast<int64_t>(classes) * 4;
      // forward: the fp32 logits and log-sum-exp's buffer (a bf16 projection's own logits are
      // freed before it); backward: the logits. Narrower activations than the parameters (bf16
      // with fp32 master weights): the parameters' copy for the call, and in backward the
      // gradient's narrow copy and the chunk's rows widened for the weight's gradient.
      const int64_t activation = dtype_size(g.tensor(n.inputs[0]).dtype);
      int64_t params = 0, param_elements = 0;
      for (const ParamSpec& p : n.params) params += p.bytes(), param_elements += numel(p.shape);
      const bool narrow = activation < dtype_size(n.params[0].dtype);
      const int64_t copies = narrow ? param_elements * activation : 0;
      f.fwd_workspace = 2 * logits + copies;
      f.bwd_workspace = logits + (narrow ? copies + chunk * static_cast<int64_t>(classes) * activation +
                                               chunk * static_cast<int64_t>(dim) * 4
                                         : 0);
      f.flops = 2.0 * positions * dim * classes;
      f.bwd_flops = 3 * f.flops;                          // the recomputed projection and the two gradient products
      const double weight = static_cast<double>(params);  // read once per chunk
      f.bytes = static_cast<double>(g.tensor(n.inputs[0]).bytes()) + chunks * weight + 3.0 * positions * classes * 4;
      f.bwd_bytes = 2.0 * static_cast<double>(g.tensor(n.inputs[0]).bytes()) + 3 * chunks * weight +
                    5.0 * positions * classes * 4;
      f.kernels = 6 * static_cast<int>(chunks);
      f.bwd_kernels = 8 * static_cast<int>(chunks);
      break;
    }
    case OpKind::Scale:  // gradients need shapes only
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Mean:
    case OpKind::Affine:
    case OpKind::Concat:
    case OpKind::GlobalAvgPool:
    case OpKind::CausalMask:
    case OpKind::RelPosBias:
      break;
    case OpKind::Aten:
      throw std::logic_error("zoo_facts: an imported node");
  }
}

// bf16 zoo graphs: parameters are cast to bf16 at each use. Linear, convolution and the affine
// part of a layer norm keep their weight's copy until their backward (the normalizations keep
// none, as measured); a position table's slice keeps the whole table's copy alive.
void bf16_weight_copies(const OpGraph& g, const Node& n, OpFacts& f) {
  const bool keeps_weight = n.kind == OpKind::Linear || n.kind == OpKind::Conv2d || n.kind == OpKind::ScaleShift;
  int64_t weight_elements = n.params.empty() ? 0 : numel(n.params[0].shape);
  if (n.ints.count("rows"))  // a chunk of a tied projection copies its rows only
    weight_elements = weight_elements / n.params[0].shape[0] * (n.attr_ints("rows")[1] - n.attr_ints("rows")[0]);
  const int64_t weight_copy = weight_elements * dtype_size(DType::BF16);
  if (keeps_weight) f.internal_bytes += weight_copy;
  if (n.kind == OpKind::PosEmbedding)
    f.output_is_param_view = false, f.internal_bytes += weight_copy - g.tensor(n.outputs[0]).bytes();
  if (n.kind == OpKind::BatchNorm2d)
    f.internal_bytes = g.tensor(n.outputs[0]).shape[1] * 6;  // mean fp32, inverse std bf16
}

OpFacts facts(const OpGraph& g, const std::vector<Strides>& st, const Node& n, const std::vector<bool>& rg) {
  OpFacts f;
  f.bytes = static_cast<double>(g.tensor(n.outputs[0]).bytes());
  for (int t : n.inputs) f.bytes += static_cast<double>(g.tensor(t).bytes());
  f.bwd_bytes = 2 * f.bytes;
  if (n.kind == OpKind::Aten) {
    aten_facts(g, st, n, rg, f);
    return f;
  }
  zoo_facts(g, st, n, f);
  if (g.precision == Precision::Bf16) bf16_weight_copies(g, n, f);
  return f;
}

}  // namespace

double model_flops_per_micro_batch(const OpGraph& g) {
  const std::vector<Strides> strides = tensor_strides(g);
  const std::vector<bool> rg = g.requires_grad();
  double flops = 0;
  for (const Node& n : g.nodes) {
    const OpFacts f = facts(g, strides, n, rg);
    flops += f.flops + (n.kind == OpKind::Input ? 0 : f.bwd_flops);
  }
  return flops;
}

UpdateTimes roofline_update_times(int64_t parameters, const DeviceSpec& spec) {
  // fp32 elements each update reads and writes per parameter, from train/optimizer.cpp's
  // in-place passes with weight decay: SGD's decay, momentum and step (12); AdamW's decay, two
  // moments, the denominator's three passes and the step (23); Adam decays the gradient (24).
  auto ms = [&](int elements) { return 1e3 * 4.0 * elements * static_cast<double>(parameters) / spec.bandwidth; };
  UpdateTimes t;
  t.sgd = ms(12), t.adamw = ms(23), t.adam = ms(24);
  return t;
}

Profile analytic_profile(const OpGraph& g, const DeviceSpec& spec, const MeasureNode& measure) {
  Profile p = profile_skeleton(g, ProfileSource::Analytic, spec.name);
  p.timing = "roofline";
  const auto depth = g.depths();
  std::vector<OpFacts> all;
  const std::vector<Strides> strides = tensor_strides(g);
  const std::vector<bool> rg = g.requires_grad();
  std::map<int, KeptFacts> measured;  // nodes whose operator has no formula
  std::map<std::string, int> unknown;
  const std::vector<int> tied_owners = g.tied_owners();
  for (const Node& n : g.nodes) {
    OpFacts f = facts(g, strides, n, rg);
    if (!f.known) {
      ++unknown[n.call.qualified()];
      if (measure) measured[n.id] = measure(g, n.id);
    }
    all.push_back(f);
    NodeProfile np = node_row(g, n.id, depth, tied_owners);
    auto seconds = [&](double flops, double bytes, int kernels) {
      return std::max(flops / spec.flops, bytes / spec.bandwidth) + kernels * spec.kernel_overhead_s;
    };
    np.fwd_ms = 1e3 * seconds(f.flops, f.bytes, f.kernels);
    np.bwd_ms = n.kind == OpKind::Input ? 0 : 1e3 * seconds(f.bwd_flops, f.bwd_bytes, f.bwd_kernels);
    np.recompute_ms = np.fwd_ms;
    np.fwd_workspace = f.fwd_workspace;
    np.bwd_workspace = f.bwd_workspace;
    auto found = measured.find(n.id);
    if (found != measured.end()) {
      np.fwd_workspace = found->second.fwd_workspace;
      np.bwd_workspace = found->second.bwd_workspace;
    }
    p.nodes.push_back(np);
    TensorProfile& out = p.tensors[n.outputs[0]];
    if (f.output_is_view) out.alias_of = n.inputs[0];
    out.param_view = f.output_is_param_view;
    for (size_t k = 0; k < f.output_alias.size(); ++k)
      if (f.output_alias[k] >= 0) p.tensors[n.outputs[k]].alias_of = f.output_alias[k];
    if (found != measured.end())
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        p.tensors[n.outputs[k]].alias_of = found->second.output_alias_of[k];
        p.tensors[n.outputs[k]].param_view = found->second.output_param_view[k];
      }
  }
  for (const Node& n : g.nodes) {
    const OpFacts& f = all[n.id];
    bool any_grad = false;
    for (int t : n.outputs) any_grad = any_grad || rg[t];
    if (!any_grad) continue;  // no backward, nothing kept
    auto found = measured.find(n.id);
    if (found != measured.end()) {
      for (int t : found->second.saved_inputs) add_saved(p, t, n.id);
      for (size_t k = 0; k < n.outputs.size(); ++k)
        if (found->second.output_saved[k]) add_saved(p, n.outputs[k], n.id);
      if (found->second.internal_bytes > 0) add_internals(p, g, strides, n.id, found->second.internal_bytes);
      continue;
    }
    for (int i : f.saved_inputs) add_saved(p, n.inputs.at(i), n.id);
    if (f.saves_output) add_saved(p, n.outputs[0], n.id);
    if (f.internal_bytes > 0) add_internals(p, g, strides, n.id, f.internal_bytes);
  }
  if (!unknown.empty()) {
    std::string ops;
    int count = 0;
    for (const auto& [op, k] : unknown) ops += (ops.empty() ? "" : ", ") + op + " x" + std::to_string(k), count += k;
    p.notes =
        "no roofline formula for " + std::to_string(count) + " nodes (" + ops + "): " +
        (measure ? "what autograd keeps was measured on this machine" : "every floating-point input assumed kept") +
        ", times memory-bound";
  }
  p.update_ms = roofline_update_times(g.parameter_count(), spec);
  finish_profile(p, g);
  return p;
}

Profile analytic_profile_model(const ModelSource& model, const std::vector<int64_t>& sizes, const DeviceSpec& spec,
                               const MeasureNode& measure) {
  if (sizes.empty()) throw ConfigError("no micro-batch size to profile");
  std::vector<Profile> ps;
  for (int64_t b : sizes) ps.push_back(analytic_profile(model.graph(b), spec, measure));
  Profile p = ps.front();
  p.profiled_batch_sizes = sizes;
  if (ps.size() < 2) return p;
  const double x0 = static_cast<double>(sizes[0]), x1 = static_cast<double>(sizes.back());
  auto line = [&](double y0, double y1) {
    const double slope = (y1 - y0) / (x1 - x0);
    return LinearFit{y0 - slope * x0, slope};
  };
  const std::vector<ByteSamples> samples = batch_byte_samples(p, ps, sizes);
  for (size_t t = 0; t < p.tensors.size(); ++t) p.tensors[t].bytes_fit = fit_bytes(samples[t]);
  for (size_t n = 0; n < p.nodes.size(); ++n) {
    p.nodes[n].fwd_ms_fit = line(ps.front().nodes[n].fwd_ms, ps.back().nodes[n].fwd_ms);
    p.nodes[n].bwd_ms_fit = line(ps.front().nodes[n].bwd_ms, ps.back().nodes[n].bwd_ms);
    const double full_at = p.nodes[n].workspace_full_at;
    p.nodes[n].fwd_workspace_fit = fit_workspace(
        {x0, x1},
        {static_cast<double>(ps.front().nodes[n].fwd_workspace), static_cast<double>(ps.back().nodes[n].fwd_workspace)},
        full_at);
    p.nodes[n].bwd_workspace_fit = fit_workspace(
        {x0, x1},
        {static_cast<double>(ps.front().nodes[n].bwd_workspace), static_cast<double>(ps.back().nodes[n].bwd_workspace)},
        full_at);
  }
  return p;
}

}  // namespace dawnpiper
