#include "models/model_file.h"

#include <limits>
#include <map>
#include <set>
#include <stdexcept>

#include "util/error.h"
#include "util/safetensors.h"

namespace dawnpiper {

namespace {

std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Sizes are integers or {"sym": [a, b]} = a * B + b.
int64_t size_at(const Json& v, int64_t batch) {
  if (v.is_object()) {
    const Json& ab = v.at("sym");
    return ab[0].get<int64_t>() * batch + ab[1].get<int64_t>();
  }
  return v.get<int64_t>();
}

Shape shape_at(const Json& list, int64_t batch) {
  Shape s;
  for (const Json& d : list) s.push_back(size_at(d, batch));
  return s;
}

struct Builder {
  const ModelFile& file;
  int64_t batch;
  OpGraph g;
  std::map<std::string, int> tensor_of;                    // graph tensor by name
  std::map<std::string, std::pair<int, int>> param_owner;  // weight name -> (node, param index)
  std::map<std::string, const Json*> weight_entry;
  std::map<std::string, int> buffer_of;
  std::set<std::string> read;  // tensor names some node reads

  [[noreturn]] void bad(const std::string& what) const { throw ConfigError("model file '" + file.path + "': " + what); }

  void collect_reads(const Json& a) {
    if (a.is_object() && a.contains("t")) read.insert(a.at("t").get<std::string>());
    if (a.is_array())
      for (const Json& x : a) collect_reads(x);
  }

  AtenArg arg(const Json& v, Node& n) {
    AtenArg a;
    if (v.is_null()) return a;
    if (v.is_boolean()) return a.kind = AtenArg::Kind::Bool, a.i = v.get<bool>(), a;
    if (v.is_string()) return a.kind = AtenArg::Kind::String, a.s = v.get<std::string>(), a;
    if (v.is_number_integer()) return a.kind = AtenArg::Kind::Int, a.i = v.get<int64_t>(), a;
    if (v.is_number()) return a.kind = AtenArg::Kind::Real, a.r = v.get<double>(), a;
    if (v.is_array()) {
      a.kind = AtenArg::Kind::List;
      for (const Json& x : v) a.items.push_back(arg(x, n));
      return a;
    }
    if (!v.is_object()) bad("node " + n.name + " has an argument of an unknown kind");
    if (v.contains("t")) {
      const std::string& name = v.at("t").get<std::string>();
      auto it = tensor_of.find(name);
      if (it == tensor_of.end()) bad("node " + n.name + " reads " + name + " before it is produced");
      a.kind = AtenArg::Kind::Tensor;
      a.i = -1;
      for (size_t i = 0; i < n.inputs.size(); ++i)
        if (n.inputs[i] == it->second) a.i = static_cast<int64_t>(i);
      if (a.i < 0) {  // each tensor is one input, however often the call reads it
        a.i = static_cast<int64_t>(n.inputs.size());
        n.inputs.push_back(it->second);
      }
      return a;
    }
    if (v.contains("w")) return weight(v.at("w").get<std::string>(), n);
    if (v.contains("sym")) {
      a.kind = AtenArg::Kind::Int;
      a.i = size_at(v, batch);
      return a;
    }
    if (v.contains("float")) {
      const std::string& s = v.at("float").get<std::string>();
      a.kind = AtenArg::Kind::Real;
      a.r = s == "nan" ? std::numeric_limits<double>::quiet_NaN()
                       : (s == "-inf" ? -1 : 1) * std::numeric_limits<double>::infinity();
      return a;
    }
    if (v.contains("dtype")) {
      a.kind = AtenArg::Kind::DType;
      a.i = static_cast<int64_t>(dtype_from_name(v.at("dtype").get<std::string>()));
      return a;
    }
    if (v.contains("device")) return a.kind = AtenArg::Kind::Device, a;
    if (v.contains("layout")) return a.kind = AtenArg::Kind::Layout, a.s = v.at("layout").get<std::string>(), a;
    if (v.contains("memory_format"))
      return a.kind = AtenArg::Kind::MemoryFormat, a.s = v.at("memory_format").get<std::string>(), a;
    bad("node " + n.name + " has an argument of unknown form " + v.dump());
  }

  // A parameter: the first node reading it owns it, later readers hold a tie to the owner. A
  // buffer or constant: one graph-wide entry.
  AtenArg weight(const std::string& name, Node& n) {
    AtenArg a;
    auto entry = weight_entry.find(name);
    if (entry == weight_entry.end()) bad("node " + n.name + " reads weight " + name + ", which the file does not list");
    const Json& w = *entry->second;
    if (w.at("kind").get<std::string>() != "param") {
      auto [it, inserted] = buffer_of.emplace(name, static_cast<int>(g.buffers.size()));
      if (inserted) {
        BufferSpec b;
        b.name = name;
        b.shape = shape_at(w.at("shape"), batch);
        b.dtype = dtype_from_name(w.at("dtype").get<std::string>());
        g.buffers.push_back(b);
      }
      a.kind = AtenArg::Kind::Buffer;
      a.i = it->second;
      return a;
    }
    a.kind = AtenArg::Kind::Param;
    for (size_t i = 0; i < n.params.size(); ++i)
      if (n.params[i].source == name) return a.i = static_cast<int64_t>(i), a;
    ParamSpec p;
    p.name = name;
    p.source = name;
    p.shape = shape_at(w.at("shape"), batch);
    p.dtype = dtype_from_name(w.at("dtype").get<std::string>());
    p.init = Init::File;
    if (w.contains("aliases"))
      for (const Json& alias : w.at("aliases")) p.aliases.push_back(alias.get<std::string>());
    auto owner = param_owner.find(name);
    if (owner != param_owner.end()) {
      p.tied_node = owner->second.first;
      p.tied_param = owner->second.second;
    } else {
      param_owner[name] = {n.id, static_cast<int>(n.params.size())};
    }
    a.i = static_cast<int64_t>(n.params.size());
    n.params.push_back(std::move(p));
    return a;
  }

  // scripts/dawnpiper_ops.py's fused LM loss becomes the zoo's node of that kind: inputs hidden
  // states and labels, parameters weight (often tied) and bias, attr chunk_tokens.
  void as_linear_cross_entropy(Node& n) {
    using K = AtenArg::Kind;
    const std::vector<AtenArg>& a = n.call.args;
    const bool well_formed = a.size() == 5 && a[0].kind == K::Tensor && a[1].kind == K::Param && a[1].i == 0 &&
                             (a[2].kind == K::None || (a[2].kind == K::Param && a[2].i == 1)) &&
                             a[3].kind == K::Tensor && a[4].kind == K::Int && a[4].i > 0;
    if (!well_formed)
      bad("node " + n.name + ": dawnpiper::linear_cross_entropy takes (hidden, weight, bias or None, labels, " +
          "chunk_tokens > 0)");
    const TensorInfo& hidden = g.tensor(n.inputs[static_cast<size_t>(a[0].i)]);
    const TensorInfo& labels = g.tensor(n.inputs[static_cast<size_t>(a[3].i)]);
    Shape positions = hidden.shape;
    if (!positions.empty()) positions.pop_back();
    if (!is_floating(hidden.dtype) || labels.dtype != DType::I64 || labels.shape != positions ||
        n.params[0].shape.size() != 2 || hidden.shape.empty() || n.params[0].shape[1] != hidden.shape.back() ||
        (n.params.size() > 1 && n.params[1].shape != Shape{n.params[0].shape[0]}))
      bad("node " + n.name + ": dawnpiper::linear_cross_entropy needs float hidden states [.., H], int64 labels of " +
          "their positions, a weight [C, H] and a bias [C]");
    n.kind = OpKind::LinearCrossEntropy;
    n.inputs = {n.inputs[static_cast<size_t>(a[0].i)], n.inputs[static_cast<size_t>(a[3].i)]};
    n.ints["chunk_tokens"] = {a[4].i};
    n.call = AtenCall{{}, {}, {}, {}, {}, n.call.module};
  }

  // aten::cross_entropy_loss(logits [N, C], labels [N] int64) with its defaults (no class
  // weights, mean, ignore_index -100, no label smoothing), as Hugging Face's heads call it,
  // becomes the zoo's loss node: its executor writes the logits' gradient over their
  // log-probabilities (exec/cross_entropy.h). Other calls run as recorded.
  void maybe_as_cross_entropy(Node& n, const std::string& loss) {
    using K = AtenArg::Kind;
    const std::vector<AtenArg>& a = n.call.args;
    auto is_int = [&](size_t i, int64_t v) { return a.size() <= i || (a[i].kind == K::Int && a[i].i == v); };
    const bool defaults = a.size() >= 2 && a.size() <= 6 && a[0].kind == K::Tensor && a[1].kind == K::Tensor &&
                          (a.size() <= 2 || a[2].kind == K::None) && is_int(3, 1) && is_int(4, kIgnoredLabel) &&
                          (a.size() <= 5 || (a[5].kind == K::Real && a[5].r == 0.0) || is_int(5, 0));
    // Only the model's loss (a graph may compute others and sum them), over fp32 or bf16 logits
    // (the executor's loss is fp32: other widths would change the numbers).
    if (!defaults || n.outputs.size() != 1 || g.tensor(n.outputs[0]).name != loss) return;
    const TensorInfo& logits = g.tensor(n.inputs[static_cast<size_t>(a[0].i)]);
    const TensorInfo& labels = g.tensor(n.inputs[static_cast<size_t>(a[1].i)]);
    if (logits.shape.size() != 2 || labels.dtype != DType::I64 || labels.shape != Shape{logits.shape[0]} ||
        (logits.dtype != DType::F32 && logits.dtype != DType::BF16))
      return;
    n.kind = OpKind::CrossEntropy;
    n.inputs = {n.inputs[static_cast<size_t>(a[0].i)], n.inputs[static_cast<size_t>(a[1].i)]};
    n.call = AtenCall{{}, {}, {}, {}, {}, n.call.module};
  }

  int add_tensor(const std::string& name, int producer, const Json& meta) {
    TensorInfo t;
    t.id = static_cast<int>(g.tensors.size());
    t.producer = producer;
    t.name = name;
    t.shape = shape_at(meta.at("shape"), batch);
    t.strides = shape_at(meta.at("strides"), batch);
    t.dtype = dtype_from_name(meta.at("dtype").get<std::string>());
    t.requires_grad = meta.contains("requires_grad") && meta.at("requires_grad").get<bool>() ? 1 : 0;
    if (tensor_of.count(name)) bad("two tensors are called " + name);
    tensor_of[name] = t.id;
    g.tensors.push_back(std::move(t));
    return g.tensors.back().id;
  }

  void build() {
    const Json& graph = file.graph;
    g.model = file.architecture;
    g.precision = file.precision;
    g.preset = file.name;
    g.micro_batch_size = batch;
    for (const Json& b : graph.at("blocks")) g.blocks.push_back(b.get<std::string>());
    if (g.blocks.empty()) g.blocks.push_back("main");
    for (const Json& w : graph.at("weights")) weight_entry[w.at("name").get<std::string>()] = &w;
    const Json& nodes = graph.at("nodes");
    for (const Json& n : nodes) collect_reads(n.at("args"));
    const std::string loss = graph.at("loss").get<std::string>();
    read.insert(loss);
    // Data inputs first: every stage that reads one loads it itself.
    for (const Json& in : graph.at("inputs")) {
      const std::string name = in.at("name").get<std::string>();
      if (!read.count(name)) continue;  // the model ignores it
      Node node;
      node.id = g.size();
      node.kind = OpKind::Input;
      node.name = name;
      node.role = in.contains("role") ? in.at("role").get<std::string>() : "randn";
      for (const char* key : {"vocab", "mask_token", "high"})
        if (in.contains(key)) node.ints[key] = {in.at(key).get<int64_t>()};
      node.outputs.push_back(add_tensor(name, node.id, in));
      g.nodes.push_back(std::move(node));
    }
    for (const Json& j : nodes) {
      Node n;
      n.id = g.size();
      n.kind = OpKind::Aten;
      const std::string fx_name = j.at("name").get<std::string>();
      n.call.module = j.contains("module") ? j.at("module").get<std::string>() : "";
      n.name = n.call.module.empty() ? fx_name : n.call.module + "/" + fx_name;
      n.block = j.at("block").get<int>();
      if (n.block < 0 || n.block >= static_cast<int>(g.blocks.size())) bad("node " + fx_name + " has no block");
      n.call.op = j.at("op").get<std::string>();
      n.call.overload = j.at("overload").get<std::string>();
      for (const Json& a : j.at("args")) n.call.args.push_back(arg(a, n));
      const Json& outs = j.at("outputs");
      for (size_t k = 0; k < outs.size(); ++k) {
        const Json& o = outs[k];
        if (o.is_null() || !read.count(o.at("name").get<std::string>())) continue;  // nobody reads it
        n.outputs.push_back(add_tensor(o.at("name").get<std::string>(), n.id, o));
        n.call.result_index.push_back(static_cast<int>(k));
        n.call.view_of_arg.push_back(o.value("view_of_arg", -1));
      }
      if (n.outputs.empty()) bad("node " + fx_name + " produces nothing the graph reads");
      if (n.call.op == "dawnpiper::linear_cross_entropy") as_linear_cross_entropy(n);
      if (n.call.op == "aten::cross_entropy_loss" && n.call.overload.empty()) maybe_as_cross_entropy(n, loss);
      for (int t : n.inputs) {
        auto& cons = g.tensors[static_cast<size_t>(t)].consumers;
        if (cons.empty() || cons.back() != n.id) cons.push_back(n.id);
      }
      g.nodes.push_back(std::move(n));
    }
    if (g.nodes.back().outputs.size() != 1 || g.tensors[g.nodes.back().outputs[0]].name != loss)
      bad("the loss " + loss + " is not the last node's output");
  }
};

// The model file's format, version, model name, precision and batch range; every weight it
// lists must be in the file.
void read_header(ModelFile& file, const SafetensorsFile& st) {
  const std::string& path = file.path;
  const Json& g = file.graph;
  if (!g.is_object() || !g.contains("format") || g.at("format").get<std::string>() != "dawnpiper-model")
    throw ConfigError("'" + path + "' is not a DawnPiper model file");
  const int64_t version = g.at("version").get<int64_t>();
  if (version != ModelFile::kFormatVersion)
    throw ConfigError("model file '" + path + "' has format version " + std::to_string(version) +
                      "; this dawnpiper reads version " + std::to_string(ModelFile::kFormatVersion) +
                      " (export it again with this checkout's scripts/export_model.py)");
  const Json& model = g.at("model");
  file.architecture = model.contains("architecture")
                          ? model.at("architecture").get<std::string>()
                          : (model.contains("function") ? model.at("function").get<std::string>() : "imported");
  file.precision =
      g.contains("precision") ? from_name<Precision>(g.at("precision").get<std::string>()) : Precision::Fp32;
  file.min_batch = g.at("batch").at("min").get<int64_t>();
  file.max_batch = g.at("batch").at("max").get<int64_t>();
  for (const Json& w : g.at("weights"))
    if (!st.contains(w.at("name").get<std::string>()))
      throw ConfigError("model file '" + path + "' lists weight " + w.at("name").get<std::string>() +
                        " but holds no tensor of that name");
}

}  // namespace

std::shared_ptr<const ModelFile> read_model_file(const std::string& path) {
  SafetensorsFile st(path);
  const std::string text = st.metadata("dawnpiper_model");
  if (text.empty())
    throw ConfigError("'" + path +
                      "' is not a DawnPiper model file (a safetensors file without the graph; make one "
                      "with scripts/export_model.py)");
  auto file = std::make_shared<ModelFile>();
  file->path = path;
  file->name = base_name(path);
  file->graph = read_json("model file '" + path + "': its graph is not valid JSON", [&] { return Json::parse(text); });
  read_json("model file '" + path + "'", [&] { read_header(*file, st); });
  return file;
}

OpGraph build_imported(const ModelFile& file, int64_t micro_batch_size, const std::string& init_from) {
  if (micro_batch_size < file.min_batch || micro_batch_size > file.max_batch)
    throw ConfigError("model file '" + file.path + "' serves micro-batch sizes " + std::to_string(file.min_batch) +
                      " to " + std::to_string(file.max_batch) + ", not " + std::to_string(micro_batch_size));
  Builder b{file, micro_batch_size, {}, {}, {}, {}, {}, {}};
  try {
    b.build();
  } catch (const ConfigError& e) {
    if (e.reason().find(file.path) != std::string::npos) throw;
    throw ConfigError("model file '" + file.path + "' has a malformed graph: " + e.reason());
  } catch (const nlohmann::json::exception& e) {
    throw_json_error("model file '" + file.path + "' has a malformed graph", e);
  } catch (const std::exception& e) {
    throw ConfigError("model file '" + file.path + "' has a malformed graph: " + e.what());
  }
  if (!init_from.empty()) b.g.weight_files.push_back(init_from);
  b.g.weight_files.push_back(file.path);
  try {
    b.g.validate();
  } catch (const std::logic_error& e) {
    throw ConfigError("model file '" + file.path + "': " + e.what());
  }
  return std::move(b.g);
}

}  // namespace dawnpiper
