#include "profile/profiler.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>

#include "data/synthetic.h"
#include "data/scalar_type.h"
#include "exec/stage_module.h"
#include "memory/torch_compat.h"
#include "memory/device_memory.h"
#include "memory/runtime_bytes.h"
#include "profile/measure_host_link.h"
#include "profile/measure_updates.h"
#include "profile/device_timer.h"
#include "profile/in_step_timing.h"
#include "profile/profile_builder.h"
#include "train/optimizer.h"
#include "util/error.h"
#include "util/stopwatch.h"

namespace dawnpiper {

namespace {

struct Stats {
  double mean = 0, std = 0;
};

Stats stats(const std::vector<double>& xs) {
  Stats s;
  if (xs.empty()) return s;
  s.mean = std::accumulate(xs.begin(), xs.end(), 0.0) / xs.size();
  double var = 0;
  for (double x : xs) var += (x - s.mean) * (x - s.mean);
  s.std = xs.size() > 1 ? std::sqrt(var / (xs.size() - 1)) : 0;
  return s;
}

struct NodeMeasurement {
  std::vector<double> fwd_ms, bwd_ms;
  KeptFacts kept;  // what autograd keeps, aliases, workspaces (may be negative: clamped on use)
};

bool same_storage(const at::Tensor& a, const at::Tensor& b) {
  return a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl();
}

// Runs node n alone: fresh inputs shaped (and strided: `strides`, per tensor) as in the real
// graph, its parameters, warm-up and measured iterations of forward + backward.
class NodeMeasurer {
 public:
  NodeMeasurer(const OpGraph& g, int n, const std::vector<bool>& rg, const std::vector<Strides>& strides,
               const SyntheticData& data, const ProfilerOptions& opt)
      : g_(g),
        n_(n),
        node_(g.nodes[n]),
        rg_(rg),
        strides_(strides),
        opt_(opt),
        dev_(opt.device),
        module_(g, n, n + 1, opt.seed, opt.device),
        env_(module_.make_env()) {
    ins_.assign(node_.inputs.begin(), node_.inputs.end());
    std::sort(ins_.begin(), ins_.end());
    ins_.erase(std::unique(ins_.begin(), ins_.end()), ins_.end());
    for (int t : ins_) {
      if (g.is_data(t)) {
        data.load(env_, {t}, 0, dev_);
        inputs_.push_back(env_[t]);
      } else {
        inputs_.push_back(rebuild(t));
      }
    }
  }

  NodeMeasurement run() {
    const size_t outs_n = node_.outputs.size();
    m_.kept.output_saved.assign(outs_n, 0);
    m_.kept.output_alias_of.assign(outs_n, -1);
    m_.kept.output_param_view.assign(outs_n, 0);
    m_.kept.output_contiguous.assign(outs_n, 1);
    const int total = opt_.warmup + opt_.iterations;
    for (int it = 0; it < total; ++it) iteration(it, it >= opt_.warmup, it == total - 1);
    iteration(total, /*measured=*/false, /*last=*/false, /*input_only=*/true);
    return m_;
  }

 private:
  // One forward's outputs: the input each views (-1: none), whether it views a parameter or
  // buffer, and the bytes of the new storages among them (each counted once).
  struct Outputs {
    std::vector<at::Tensor> tensors;
    std::vector<int> alias;
    std::vector<char> param_view;
    int64_t own_bytes = 0;
  };

  // An input that is a view in the real graph (transposes, reshapes of them) is rebuilt as the
  // same chain of views over a fresh leaf, so it has the real strides: ops that copy or view
  // depending on strides (reshape, matmul) then behave as they will in training.
  at::Tensor rebuild(int t) {
    const TensorInfo& info = g_.tensor(t);
    const Node& producer = g_.nodes[info.producer];
    if (producer.kind == OpKind::Transpose) return rebuild(producer.inputs[0]).permute(producer.attr_ints("dims"));
    if (producer.kind == OpKind::Reshape) return rebuild(producer.inputs[0]).reshape(info.shape);
    // Integers are zeros (valid indices everywhere), booleans true (masks that keep everything).
    const at::ScalarType type = scalar_type(info.dtype);
    const Strides& layout = strides_[static_cast<size_t>(t)];
    const bool contiguous = layout == contiguous_strides(info.shape);
    int64_t storage = 1;  // elements the strides reach (an expanded dimension reaches one)
    for (size_t d = 0; d < info.shape.size(); ++d) storage += (info.shape[d] - 1) * layout[d];
    if (numel(info.shape) == 0) storage = 0;
    // A permuted layout (a transposed weight, attention heads) is the leaf's own, so that the
    // backward hands its gradient to the leaf as the real graph's view does: through as_strided
    // the backward would add a gradient buffer of the leaf's size.
    const bool permuted = !contiguous && is_dense(info.shape, layout);
    const at::TensorOptions options = at::TensorOptions(type).device(dev_);
    at::Tensor leaf = contiguous ? at::empty(info.shape, options)
                      : permuted ? at::empty_strided(info.shape, layout, options)
                                 : at::empty(Shape{storage}, options);
    if (at::isFloatingType(type))
      leaf.uniform_(0.5, 1.5);
    else
      leaf.fill_(type == at::kBool ? 1 : 0);
    if (rg_[t]) leaf.requires_grad_(true);
    // A non-leaf handle: autograd's references to it show. A plain view where the layout is
    // contiguous or permuted: as_strided's backward would add a gradient buffer of its own.
    return contiguous || permuted ? leaf.view(info.shape) : leaf.as_strided(info.shape, layout);
  }

  // The buffers the node exposes in its internal slots (StageModule::internal_slot; a loss's
  // log-probabilities, a dropout's mask) leave env_ at once: what the node keeps is autograd's
  // alone, and nothing of one iteration outlives it into the next one's measurement. They are
  // remembered weakly: a backward that writes a gradient over one (the loss over its
  // log-probabilities) makes no new buffer.
  void take_internals() {
    internals_.clear();
    for (size_t slot = g_.tensors.size(); slot < env_.size(); ++slot)
      if (env_[slot].defined()) {
        internals_.push_back(env_[slot].storage().getWeakStorageImpl());
        env_[slot] = at::Tensor();
      }
  }
  bool is_internal(const c10::StorageImpl* storage) const {
    return std::any_of(internals_.begin(), internals_.end(),
                       [&](const c10::weak_intrusive_ptr<c10::StorageImpl>& w) { return w.lock().get() == storage; });
  }

  // input_only: a forward and the node's part of I (input_pass) instead of its backward.
  void iteration(int it, bool measured, bool last, bool input_only = false);
  Outputs outputs() const;
  void record_kept(const Outputs& o, int64_t held, const std::vector<size_t>& storage_uses);
  void backward(const Outputs& o, bool measured, bool input_only);
  void input_pass(const std::vector<at::Tensor>& with_grad, const std::vector<at::Tensor>& grads);

  const OpGraph& g_;
  const int n_;
  const Node& node_;
  const std::vector<bool>& rg_;
  const std::vector<Strides>& strides_;
  const ProfilerOptions& opt_;
  const c10::Device dev_;
  StageModule module_;
  TensorEnv env_;
  std::vector<int> ins_;            // distinct inputs, ascending
  std::vector<at::Tensor> inputs_;  // per input: what the node reads (a view of its leaf)
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> internals_;  // this iteration's (take_internals)
  NodeMeasurement m_;
};

void NodeMeasurer::iteration(int it, bool measured, bool last, bool input_only) {
  for (size_t i = 0; i < ins_.size(); ++i) env_[ins_[i]] = inputs_[i];
  // References to each input's storage before the node runs (its leaf, the view we pass): any
  // reference autograd adds, to the input or to a view of it, means it was saved.
  std::vector<size_t> storage_uses;
  for (const at::Tensor& x : inputs_) storage_uses.push_back(x.storage().use_count());
  synchronize(dev_);
  const int64_t live0 = DeviceMemory::live_bytes(dev_);
  DeviceMemory::reset_peak(dev_);
  const double fwd = time_ms(dev_, [&] { module_.run_node(n_, env_, RunContext{0, it}); });
  take_internals();
  synchronize(dev_);
  const Outputs o = outputs();
  const int64_t fwd_peak = DeviceMemory::peak_bytes(dev_) - live0;
  const int64_t held = DeviceMemory::live_bytes(dev_) - live0;  // outputs (if new) + internal
  if (measured) {
    m_.fwd_ms.push_back(fwd);
    m_.kept.fwd_workspace = std::max(m_.kept.fwd_workspace, fwd_peak - held);
  }
  if (last) record_kept(o, held, storage_uses);
  backward(o, measured, input_only);
  for (int id : node_.outputs) env_[id] = at::Tensor();
}

NodeMeasurer::Outputs NodeMeasurer::outputs() const {
  Outputs o;
  for (int id : node_.outputs) o.tensors.push_back(env_[id]);
  const size_t outs_n = o.tensors.size();
  o.alias.assign(outs_n, -1);
  o.param_view.assign(outs_n, 0);
  std::vector<const c10::StorageImpl*> new_storages;
  for (size_t k = 0; k < outs_n; ++k) {
    const at::Tensor& out = o.tensors[k];
    for (size_t i = 0; i < ins_.size(); ++i)
      if (same_storage(out, inputs_[i])) o.alias[k] = ins_[i];  // views of data too (imported reshapes)
    for (const auto& param : module_.parameters()) o.param_view[k] = o.param_view[k] || same_storage(out, param.tensor);
    for (const at::Tensor& buffer : module_.buffers())
      o.param_view[k] = o.param_view[k] || (buffer.defined() && same_storage(out, buffer));
    const c10::StorageImpl* st = out.storage().unsafeGetStorageImpl();
    if (o.alias[k] < 0 && !o.param_view[k] &&
        std::find(new_storages.begin(), new_storages.end(), st) == new_storages.end()) {
      new_storages.push_back(st);
      o.own_bytes += out.numel() * out.element_size();
    }
  }
  return o;
}

// The last iteration: what the node keeps (internal bytes, outputs' layouts, which inputs and
// outputs autograd saved).
void NodeMeasurer::record_kept(const Outputs& o, int64_t held, const std::vector<size_t>& storage_uses) {
  const std::vector<at::Tensor>& outs = o.tensors;
  const size_t outs_n = outs.size();
  m_.kept.output_param_view = o.param_view;
  m_.kept.internal_bytes = std::max<int64_t>(0, held - o.own_bytes);
  m_.kept.output_alias_of = o.alias;
  m_.kept.output_strides.clear();
  for (size_t k = 0; k < outs_n; ++k) {
    m_.kept.output_contiguous[k] = outs[k].is_contiguous();
    m_.kept.output_strides.emplace_back(outs[k].strides().begin(), outs[k].strides().end());
  }
  // Drop every reference but ours: what autograd still references, it saved.
  for (int t : ins_) env_[t] = at::Tensor();
  for (int id : node_.outputs) env_[id] = at::Tensor();
  for (size_t i = 0; i < ins_.size(); ++i) {
    size_t own_views = 0;
    for (const at::Tensor& out : outs) own_views += same_storage(out, inputs_[i]) ? 1 : 0;
    if (inputs_[i].use_count() > 1 || inputs_[i].storage().use_count() > storage_uses[i] + own_views)
      m_.kept.saved_inputs.push_back(ins_[i]);
  }
  // Our handles hold an output's storage once each, and once more through the base of a view
  // (e.g. T5's bias: a permuted embedding); a further reference is autograd's.
  for (size_t k = 0; k < outs_n; ++k) {
    size_t expected_uses = outs[k].is_view() ? 2 : 1;
    for (size_t j = 0; j < outs_n; ++j)
      if (j != k && same_storage(outs[j], outs[k])) expected_uses += outs[j].is_view() ? 2 : 1;
    m_.kept.output_saved[k] =
        o.alias[k] < 0 && outs[k].requires_grad() && outs[k].storage().use_count() > expected_uses;
  }
}

// The node's part of a split backward's I (exec/split_backward.h), on an iteration of its own
// (a backward may write over what it saved, as the loss over its log-probabilities): the
// graph kept, only the gradients of the tracked inputs made (captured, as I hands them to the
// nodes before; not accumulated into the profiler's leaves, whose as_strided views would add
// storage-sized buffers). What it peaks at above those is the node's I workspace; a node made
// of several autograd functions keeps what each saved until the end, where a whole backward
// frees it function by function.
torch::autograd::edge_list gradient_edges(const std::vector<at::Tensor>& tensors) {
  torch::autograd::edge_list edges;
  for (const at::Tensor& x : tensors)
    if (x.requires_grad()) edges.push_back(torch::autograd::impl::gradient_edge(x));
  return edges;
}

void NodeMeasurer::input_pass(const std::vector<at::Tensor>& with_grad, const std::vector<at::Tensor>& grads) {
  const torch::autograd::edge_list roots = gradient_edges(with_grad), to = gradient_edges(inputs_);
  if (to.empty()) {  // I runs nothing of a node reading no tracked input
    m_.kept.bwd_input_workspace = 0;
    return;
  }
  synchronize(dev_);
  const int64_t lb0 = DeviceMemory::live_bytes(dev_);
  DeviceMemory::reset_peak(dev_);
  int64_t peak = 0, held = 0;
  {
    const std::vector<at::Tensor> got = torch::autograd::Engine::get_default_engine().execute(
        roots, grads, /*keep_graph=*/true, /*create_graph=*/false, /*accumulate_grad=*/false, to);
    synchronize(dev_);
    peak = DeviceMemory::peak_bytes(dev_) - lb0;
    held = DeviceMemory::live_bytes(dev_) - lb0;  // the inputs' gradients
    // Whether each input got the output's gradient itself (AddBackward0, CloneBackward0).
    const at::Tensor& out_grad = grads.front();
    m_.kept.passes_gradient = grads.size() == 1 && std::all_of(got.begin(), got.end(), [&](const at::Tensor& x) {
                                return x.defined() && x.data_ptr() == out_grad.data_ptr() &&
                                       x.sizes().equals(out_grad.sizes()) && x.strides().equals(out_grad.strides());
                              });
  }
  m_.kept.bwd_input_workspace = std::max<int64_t>(0, peak - held);
}

void NodeMeasurer::backward(const Outputs& o, bool measured, bool input_only) {
  std::vector<at::Tensor> with_grad, grads;
  for (const at::Tensor& out : o.tensors)
    if (out.requires_grad()) {
      with_grad.push_back(out);
      grads.push_back(out.dim() == 0 ? at::ones_like(out) : at::rand_like(out));
    }
  if (with_grad.empty()) return;
  if (input_only) {
    input_pass(with_grad, grads);
    return;
  }
  // The inputs' gradients are captured as they leave the node, as a stage hands them to the
  // nodes before: accumulated into the leaves, a leaf laid out as a strided view (GPT-NeoX's
  // split of its fused query-key-value product) would add a copy in its layout that no stage
  // makes. The parameters' gradients go through their accumulators, as in a stage.
  const torch::autograd::edge_list roots = gradient_edges(with_grad);
  torch::autograd::edge_list to = gradient_edges(inputs_);
  const size_t first_param = to.size();
  std::vector<at::Tensor> params;
  for (const auto& p : module_.parameters())
    if (p.tensor.requires_grad()) params.push_back(p.tensor);
  for (const torch::autograd::Edge& e : gradient_edges(params)) to.push_back(e);
  synchronize(dev_);
  const int64_t lb0 = DeviceMemory::live_bytes(dev_);
  DeviceMemory::reset_peak(dev_);
  // The graph let go as a stage's whole backward lets it go: a node of several autograd
  // functions (an attention with dropout on CPU) frees what each saved as it goes, and peaks
  // above that (its saved bytes are in the replay's live bytes until the node's backward ends).
  std::vector<at::Tensor> got;
  const double bwd = time_ms(dev_, [&] {
    got = torch::autograd::Engine::get_default_engine().execute(roots, grads, /*keep_graph=*/false,
                                                                /*create_graph=*/false, /*accumulate_grad=*/false, to);
    const at::NoGradGuard as_in_the_engine;  // (else the accumulator copies what it could keep)
    for (size_t k = first_param; k < got.size(); ++k) {
      if (!got[k].defined()) continue;
      torch::autograd::variable_list grad;  // the only reference, so the accumulator keeps it
      grad.push_back(std::move(got[k]));
      (*torch::autograd::impl::grad_accumulator(params[k - first_param]))(std::move(grad));
    }
  });
  synchronize(dev_);
  const int64_t bwd_peak = DeviceMemory::peak_bytes(dev_) - lb0;
  // The gradients it made: new storages (not the output's gradient handed on, or a view of it,
  // nor an internal buffer written over).
  std::vector<const c10::StorageImpl*> seen;
  for (const at::Tensor& x : grads) seen.push_back(x.storage().unsafeGetStorageImpl());
  int64_t grad_bytes = 0;
  auto count = [&](const at::Tensor& x) {
    if (!x.defined()) return;
    const c10::StorageImpl* st = x.storage().unsafeGetStorageImpl();
    if (std::find(seen.begin(), seen.end(), st) != seen.end() || is_internal(st)) return;
    seen.push_back(st);
    grad_bytes += static_cast<int64_t>(x.storage().nbytes());
  };
  for (size_t k = 0; k < first_param; ++k) count(got[k]);
  for (const at::Tensor& p : params) count(p.grad());
  if (measured) {
    m_.bwd_ms.push_back(bwd);
    m_.kept.bwd_workspace = std::max(m_.kept.bwd_workspace, bwd_peak - grad_bytes);
  }
  for (auto& p : module_.parameters()) p.tensor.mutable_grad() = at::Tensor();
}

NodeMeasurement measure_node(const OpGraph& g, int n, const std::vector<bool>& rg, const std::vector<Strides>& strides,
                             const SyntheticData& data, const ProfilerOptions& opt) {
  return NodeMeasurer(g, n, rg, strides, data, opt).run();
}

// Blocks whose nodes match the first block of the same shape: (kinds, output shapes, params).
std::string block_signature(const OpGraph& g, int begin, int end) {
  std::string s;
  for (int i = begin; i < end; ++i) {
    const Node& n = g.nodes[i];
    s += n.kind == OpKind::Aten ? n.call.qualified() : op_kind_name(n.kind);
    for (int out : n.outputs) s += shape_str(g.tensor(out).shape);
    for (const ParamSpec& p : n.params) s += "p" + shape_str(p.shape);
    // Inputs from inside the block by distance to their producer; inputs from outside (BERT's
    // mask, T5's position bias and encoder output, the previous block) by kind and shape.
    for (int t : n.inputs) {
      const int producer = g.tensor(t).producer;
      s += producer >= begin ? "i" + std::to_string(i - producer)
                             : std::string("o") + op_kind_name(g.nodes[producer].kind) + shape_str(g.tensor(t).shape);
    }
    s += ";";
  }
  return s;
}

// A measurement of node src (in an earlier block of the same structure) as node n's: tensor ids
// translated by the node's inputs.
NodeMeasurement translated(const OpGraph& g, NodeMeasurement m, int src, int n) {
  const std::vector<int>& from = g.nodes[src].inputs;
  auto input_of_n = [&](int t) {
    return g.nodes[n].inputs.at(static_cast<size_t>(std::find(from.begin(), from.end(), t) - from.begin()));
  };
  for (int& t : m.kept.saved_inputs) t = input_of_n(t);
  for (int& alias : m.kept.output_alias_of)
    if (alias >= 0) alias = input_of_n(alias);
  return m;
}

// Every node measured in isolation; a block with the structure of an earlier one copies its
// measurements (share_repeated_blocks).
std::vector<NodeMeasurement> measure_nodes(const OpGraph& g, const ProfilerOptions& opt) {
  const std::vector<bool> rg = g.requires_grad();
  SyntheticData data(g, opt.seed);
  std::vector<std::pair<int, int>> block_range(g.blocks.size(), {g.size(), 0});
  for (const Node& n : g.nodes) {
    auto& r = block_range[n.block];
    r.first = std::min(r.first, n.id);
    r.second = std::max(r.second, n.id + 1);
  }
  std::map<std::string, int> first_block_with;  // signature -> block index
  std::vector<NodeMeasurement> measured(g.size());
  std::vector<Strides> strides = tensor_strides(g);
  for (size_t b = 0; b < g.blocks.size(); ++b) {
    auto [begin, end] = block_range[b];
    if (begin >= end) continue;
    int source_block = -1;
    if (opt.share_repeated_blocks) {
      auto [it, inserted] = first_block_with.emplace(block_signature(g, begin, end), static_cast<int>(b));
      if (!inserted) source_block = it->second;
    }
    if (opt.progress)
      std::fprintf(stderr, "profiling %s (%d nodes)%s\n", g.blocks[b].c_str(), end - begin,
                   source_block >= 0 ? ", shared" : "");
    for (int n = begin; n < end; ++n) {
      if (source_block >= 0) {
        const int src = block_range[source_block].first + (n - begin);
        measured[n] = translated(g, measured[src], src, n);
      } else if (g.nodes[n].kind != OpKind::Input) {
        measured[n] = measure_node(g, n, rg, strides, data, opt);
      }
      // Its readers get its outputs as the kernel laid them out, which may not be what
      // torch.export recorded: on CPU an attention whose mask requires grad takes the math path,
      // a contiguous output where the export saw the fused kernel's transposed one.
      const std::vector<Strides>& made = measured[n].kept.output_strides;
      for (size_t k = 0; k < made.size(); ++k) strides[static_cast<size_t>(g.nodes[n].outputs[k])] = made[k];
    }
  }
  return measured;
}

// Node times from runs of the whole step, when it fits (the isolated ones stay otherwise).
void use_in_step_timing(Profile& p, const OpGraph& g, const ProfilerOptions& opt) {
  try {
    const InStepTiming t = measure_in_step(g, opt);
    for (NodeProfile& np : p.nodes) {
      np.fwd_ms = np.recompute_ms = t.fwd_ms[np.id];
      np.fwd_ms_std = t.fwd_ms_std[np.id];
      np.bwd_ms = t.bwd_ms[np.id];
      np.bwd_ms_std = t.bwd_ms_std[np.id];
      if (np.param_bytes > 0 || np.tied_owner >= 0)  // W's share of the node's backward
        np.weight_share = np.bwd_ms > 0 ? std::clamp(t.weight_ms[np.id] / np.bwd_ms, 0.0, 1.0) : -1;
      else
        np.weight_share = 0;
    }
    p.timing = "in-step";
    p.measured_fwd_bwd_ms = t.plain_fwd_bwd_ms;
  } catch (const std::exception& e) {
    if (!is_out_of_memory(e)) throw;
    if (opt.progress) std::fprintf(stderr, "the whole step does not fit: node times are from isolated runs\n");
  }
}

}  // namespace

Profile profile_graph(const OpGraph& g, const ProfilerOptions& opt) {
  if (g.micro_batch_size < 1) throw ConfigError("micro-batch size must be at least 1");
  Profile p = profile_skeleton(g, ProfileSource::Measured, opt.device.str());
  p.torch_version = torch_version_string();
  // First, before any node's product creates the library workspaces it would be charged for.
  const bool convolutions = std::any_of(g.nodes.begin(), g.nodes.end(), [](const Node& n) {
    return n.kind == OpKind::Conv2d || n.call.op.find("conv") != std::string::npos;
  });
  p.runtime_bytes = measure_runtime_bytes(opt.device, g.precision, convolutions);
  p.host_link = measure_host_link(opt.device);
  if (opt.measure_updates) p.update_ms = measure_update_times(g, opt);
  const std::vector<NodeMeasurement> measured = measure_nodes(g, opt);
  // Assemble: node rows, aliases, saved_by (on storage owners), internal buffers.
  const std::vector<int> tied_owners = g.tied_owners();
  const auto depth = g.depths();
  for (const Node& n : g.nodes) {
    const NodeMeasurement& m = measured[n.id];
    NodeProfile np = node_row(g, n.id, depth, tied_owners);
    const Stats f = stats(m.fwd_ms), b = stats(m.bwd_ms);
    np.fwd_ms = f.mean;
    np.fwd_ms_std = f.std;
    np.bwd_ms = b.mean;
    np.bwd_ms_std = b.std;
    np.recompute_ms = f.mean;
    np.fwd_workspace = std::max<int64_t>(0, m.kept.fwd_workspace);
    np.bwd_workspace = std::max<int64_t>(0, m.kept.bwd_workspace);
    np.bwd_input_workspace = m.kept.bwd_input_workspace;
    np.passes_gradient = m.kept.passes_gradient;
    p.nodes.push_back(np);
    for (size_t k = 0; k < m.kept.output_alias_of.size(); ++k) {
      if (m.kept.output_alias_of[k] >= 0) p.tensors[n.outputs[k]].alias_of = m.kept.output_alias_of[k];
      p.tensors[n.outputs[k]].param_view = m.kept.output_param_view[k];
      p.tensors[n.outputs[k]].contiguous = m.kept.output_contiguous[k];
    }
  }
  p.timing = "isolated";
  if (opt.in_step_timing) use_in_step_timing(p, g, opt);
  const std::vector<Strides> strides = tensor_strides(g);
  for (const Node& n : g.nodes) {
    const NodeMeasurement& m = measured[n.id];
    for (int t : m.kept.saved_inputs) add_saved(p, t, n.id);
    for (size_t k = 0; k < m.kept.output_saved.size(); ++k)
      if (m.kept.output_saved[k]) add_saved(p, n.outputs[k], n.id);
    if (m.kept.internal_bytes > 0) add_internals(p, g, strides, n.id, m.kept.internal_bytes);
  }
  finish_profile(p, g);
  return p;
}

namespace {
// Worst relative error of a fit over its points, ignoring values too small to matter.
double fit_error(const LinearFit& f, const std::vector<double>& x, const std::vector<double>& y, double floor) {
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (std::fabs(y[i]) > floor)
      worst = std::max(worst, std::fabs(f.at(static_cast<int64_t>(x[i])) - y[i]) / std::fabs(y[i]));
  return worst;
}
}  // namespace

Profile profile_model(const ModelSource& model, std::vector<int64_t> batch_sizes, const ProfilerOptions& options) {
  if (batch_sizes.empty()) throw ConfigError("no micro-batch size to profile");
  for (int64_t b : batch_sizes)
    if (b < 1) throw ConfigError("micro-batch size must be at least 1");
  std::vector<Profile> profiles;
  ProfilerOptions later = options;  // the first size's update times stand for every size
  later.measure_updates = false;
  for (int64_t b : batch_sizes) profiles.push_back(profile_graph(model.graph(b), profiles.empty() ? options : later));
  Profile p = profiles.front();
  p.profiled_batch_sizes = batch_sizes;
  if (profiles.size() == 1) return p;
  std::vector<double> x(batch_sizes.begin(), batch_sizes.end());
  double worst_bytes = 0, worst_time = 0;
  const double bytes_floor = 4096;
  auto column = [&](auto get) {
    std::vector<double> y;
    for (const Profile& q : profiles) y.push_back(get(q));
    return y;
  };
  const std::vector<ByteSamples> samples = batch_byte_samples(p, profiles, batch_sizes);
  for (size_t t = 0; t < p.tensors.size(); ++t) {
    p.tensors[t].bytes_fit = fit_bytes(samples[t]);
    worst_bytes = std::max(worst_bytes, fit_error(p.tensors[t].bytes_fit, samples[t].x, samples[t].y, bytes_floor));
  }
  for (size_t n = 0; n < p.nodes.size(); ++n) {
    NodeProfile& np = p.nodes[n];
    auto f = column([&](const Profile& q) { return q.nodes[n].fwd_ms; });
    auto b = column([&](const Profile& q) { return q.nodes[n].bwd_ms; });
    auto fw = column([&](const Profile& q) { return static_cast<double>(q.nodes[n].fwd_workspace); });
    auto bw = column([&](const Profile& q) { return static_cast<double>(q.nodes[n].bwd_workspace); });
    auto iw = column([&](const Profile& q) { return static_cast<double>(q.nodes[n].bwd_input_workspace); });
    np.fwd_ms_fit = fit_line(x, f);
    np.bwd_ms_fit = fit_line(x, b);
    np.fwd_workspace_fit = fit_workspace(x, fw, np.workspace_full_at);
    np.bwd_workspace_fit = fit_workspace(x, bw, np.workspace_full_at);
    if (std::all_of(iw.begin(), iw.end(), [](double v) { return v >= 0; }))
      np.bwd_input_workspace_fit = fit_workspace(x, iw, np.workspace_full_at);
    else  // not measured at some size: I is taken to need bwd_workspace
      np.bwd_input_workspace = -1, np.bwd_input_workspace_fit = {-1, 0};
  }
  // Times: single small nodes are dominated by timer noise, so the error that matters to the
  // planner is that of summed times (a stage is a sum of nodes): the whole model's here.
  for (size_t k = 0; k < profiles.size(); ++k) {
    double fitted = 0, measured = 0;
    for (size_t n = 0; n < p.nodes.size(); ++n) {
      fitted += p.nodes[n].fwd_ms_fit.at(batch_sizes[k]) + p.nodes[n].bwd_ms_fit.at(batch_sizes[k]);
      measured += profiles[k].nodes[n].fwd_ms + profiles[k].nodes[n].bwd_ms;
    }
    if (measured > 0) worst_time = std::max(worst_time, std::fabs(fitted - measured) / measured);
  }
  p.fit_max_rel_error = std::max(worst_bytes, worst_time);
  return p;
}

KeptFacts measure_node_facts(const OpGraph& g, int node, const ProfilerOptions& options) {
  ProfilerOptions once = options;
  once.warmup = 0;
  once.iterations = 1;
  const NodeMeasurement m =
      measure_node(g, node, g.requires_grad(), tensor_strides(g), SyntheticData(g, options.seed), once);
  KeptFacts f = m.kept;
  f.fwd_workspace = std::max<int64_t>(0, f.fwd_workspace);
  f.bwd_workspace = std::max<int64_t>(0, f.bwd_workspace);
  return f;
}

StepMeasurement measure_step(const OpGraph& g, OptimizerKind optimizer, const ProfilerOptions& opt, int steps) {
  const c10::Device dev = opt.device;
  StageModule module(g, 0, g.size(), opt.seed, dev);
  std::vector<at::Tensor> params;
  for (auto& p : module.parameters()) params.push_back(p.tensor);
  OptimizerConfig oc;
  oc.kind = optimizer;
  oc.lr = 1e-4;
  auto opt_impl = make_optimizer(oc, params);
  SyntheticData data(g, opt.seed);
  const auto wanted = g.data_inputs(0, g.size());
  const int loss_id = g.nodes[g.loss_node()].outputs[0];
  std::vector<double> times, fwd_bwd;
  StepMeasurement r;
  for (int s = 0; s < steps + 2; ++s) {
    TensorEnv env = module.make_env();
    data.load(env, wanted, data.first_sample(s, 0, 1), dev);
    synchronize(dev);
    DeviceMemory::reset_peak(dev);
    const Stopwatch clock;
    module.forward(env, RunContext{s, s});
    at::Tensor loss = env[loss_id];
    env.clear();
    loss.backward();
    loss = at::Tensor();
    synchronize(dev);
    const double fb = clock.ms();
    opt_impl->step();
    synchronize(dev);
    if (s >= 2) {
      fwd_bwd.push_back(fb);
      times.push_back(clock.ms());
      r.peak_bytes = DeviceMemory::peak_bytes(dev);
    }
  }
  std::sort(times.begin(), times.end());
  std::sort(fwd_bwd.begin(), fwd_bwd.end());
  r.step_ms = times[times.size() / 2];
  r.fwd_bwd_ms = fwd_bwd[fwd_bwd.size() / 2];
  return r;
}

}  // namespace dawnpiper
