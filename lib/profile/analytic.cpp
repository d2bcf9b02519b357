#include "profile/analytic.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

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
  if (!in)
    throw ConfigError("unknown device spec '" + name + "' (use a100-40gb, h100-80gb or a spec file)");
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
  int64_t internal_bytes = 0;     // buffers only autograd holds
  bool output_is_view = false;    // alias of input 0
  bool output_is_param_view = false;
  double flops = 0, bwd_flops = 0;
  double bytes = 0, bwd_bytes = 0;
  int kernels = 1, bwd_kernels = 1;
};

OpFacts facts(const OpGraph& g, const std::vector<Strides>& st, const Node& n) {
  OpFacts f;
  const TensorInfo& out = g.tensor(n.outputs[0]);
  const double ob = static_cast<double>(out.bytes());
  auto in_bytes = [&](size_t i) { return static_cast<double>(g.tensor(n.inputs.at(i)).bytes()); };
  auto in_shape = [&](size_t i) -> const Shape& { return g.tensor(n.inputs.at(i)).shape; };
  double all_in = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i) all_in += in_bytes(i);
  f.bytes = all_in + ob;
  f.bwd_bytes = 2 * f.bytes;
  const int64_t rows = out.shape.empty() ? 1 : numel(out.shape) / out.shape.back();
  switch (n.kind) {
    case OpKind::Input: f.kernels = f.bwd_kernels = 0; f.bytes = f.bwd_bytes = 0; break;
    case OpKind::Embedding: f.saved_inputs = {0}; break;
    case OpKind::PosEmbedding: f.output_is_param_view = true; f.kernels = 0; f.bytes = 0; break;
    case OpKind::Linear: {
      f.saved_inputs = {0};
      const double k = static_cast<double>(in_shape(0).back());
      f.flops = 2.0 * static_cast<double>(numel(in_shape(0))) / k * k * static_cast<double>(out.shape.back());
      f.bwd_flops = 2 * f.flops;
      f.bytes += static_cast<double>(g.parameter_bytes(n.id));
      break;
    }
    case OpKind::LayerNorm: f.saved_inputs = {0}; f.internal_bytes = rows * 8; break;
    case OpKind::RMSNorm: f.saved_inputs = {0}; f.internal_bytes = out.bytes() + rows * 4; f.kernels = 5; f.bwd_kernels = 8; break;
    case OpKind::Gelu: case OpKind::Erf: f.saved_inputs = {0}; break;
    case OpKind::Relu: case OpKind::Tanh: case OpKind::Sqrt: case OpKind::Softmax: f.saves_output = true; break;
    case OpKind::Dropout: f.internal_bytes = numel(out.shape); f.kernels = 3; break;  // bool mask
    case OpKind::Reshape:
      f.output_is_view = reshape_is_view(g, st, n.inputs[0], out.shape);
      if (f.output_is_view) f.kernels = 0, f.bytes = 0;
      break;
    case OpKind::Transpose: f.output_is_view = true; f.kernels = 0; f.bytes = 0; break;
    case OpKind::MatMul: {
      // The backward keeps each operand, or the contiguous copy made of it.
      const std::vector<int> copied = matmul_copied_inputs(g, st, n.id);
      for (int i = 0; i < 2; ++i) {
        if (std::find(copied.begin(), copied.end(), n.inputs[i]) == copied.end()) f.saved_inputs.push_back(i);
        else f.internal_bytes += g.tensor(n.inputs[i]).bytes();
      }
      const Shape& a = in_shape(0);
      const double m = static_cast<double>(a[a.size() - 2]), k = static_cast<double>(a.back());
      const double batch = static_cast<double>(numel(a)) / (m * k);
      f.flops = 2.0 * batch * m * k * static_cast<double>(out.shape.back());
      f.bwd_flops = 2 * f.flops;
      break;
    }
    case OpKind::Scale: case OpKind::Add: case OpKind::Sub: case OpKind::Mean:
    case OpKind::Affine: case OpKind::Concat: case OpKind::GlobalAvgPool: case OpKind::CausalMask:
      break;
    case OpKind::Mul: f.saved_inputs = {0, 1}; break;
    case OpKind::Div: f.saved_inputs = {0, 1}; break;
    case OpKind::ScaleShift: f.saved_inputs = {0}; break;
    case OpKind::RelPosBias: break;
    case OpKind::Conv2d: {
      f.saved_inputs = {0};
      const Shape& w = n.params[0].shape;  // [Co, Ci, kh, kw]
      f.flops = 2.0 * static_cast<double>(numel(out.shape)) * static_cast<double>(w[1] * w[2] * w[3]);
      f.bwd_flops = 2 * f.flops;
      break;
    }
    case OpKind::BatchNorm2d: f.saved_inputs = {0}; f.internal_bytes = out.shape[1] * 8; f.kernels = 2; break;
    case OpKind::MaxPool2d: f.saved_inputs = {0}; f.internal_bytes = numel(out.shape) * 8; break;
    case OpKind::AvgPool2d: f.saved_inputs = {0}; break;
    case OpKind::CrossEntropy: {
      f.saved_inputs = {1};  // the labels
      // log-softmax of the logits, and nll_loss's total weight (one float)
      f.internal_bytes = g.tensor(n.inputs[0]).bytes() + 4;
      f.kernels = 2;
      break;
    }
  }
  return f;
}

}  // namespace

Profile analytic_profile(const OpGraph& g, const DeviceSpec& spec) {
  Profile p = profile_skeleton(g, "analytic", spec.name);
  p.timing = "roofline";
  const auto depth = g.depths();
  std::vector<OpFacts> all;
  const std::vector<Strides> strides = tensor_strides(g);
  for (const Node& n : g.nodes) {
    OpFacts f = facts(g, strides, n);
    all.push_back(f);
    NodeProfile np = node_row(g, n.id, depth);
    auto seconds = [&](double flops, double bytes, int kernels) {
      return std::max(flops / spec.flops, bytes / spec.bandwidth) + kernels * spec.kernel_overhead_s;
    };
    np.fwd_ms = 1e3 * seconds(f.flops, f.bytes, f.kernels);
    np.bwd_ms = n.kind == OpKind::Input ? 0 : 1e3 * seconds(f.bwd_flops, f.bwd_bytes, f.bwd_kernels);
    np.recompute_ms = np.fwd_ms;
    p.nodes.push_back(np);
    TensorProfile& out = p.tensors[n.outputs[0]];
    if (f.output_is_view) out.alias_of = n.inputs[0];
    out.param_view = f.output_is_param_view;
  }
  const std::vector<bool> rg = g.requires_grad();
  for (const Node& n : g.nodes) {
    const OpFacts& f = all[n.id];
    if (!rg[n.outputs[0]]) continue;  // no backward, nothing kept
    for (int i : f.saved_inputs) add_saved(p, n.inputs.at(i), n.id);
    if (f.saves_output) add_saved(p, n.outputs[0], n.id);
    if (f.internal_bytes > 0) add_internals(p, g, strides, n.id, f.internal_bytes);
  }
  finish_profile(p, g);
  return p;
}

Profile analytic_profile_model(const ModelSource& model, const std::vector<int64_t>& sizes,
                               const DeviceSpec& spec) {
  if (sizes.empty()) throw ConfigError("no micro-batch size to profile");
  std::vector<Profile> ps;
  for (int64_t b : sizes) ps.push_back(analytic_profile(model.graph(b), spec));
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
  }
  return p;
}

}  // namespace dawnpiper
