#pragma once
// OpGraph: the fine-grained operator graph (torch.fx granularity: one node per linear,
// layernorm, matmul, softmax, add, view, ...). It is pure C++ (no LibTorch) so the planner and
// the analytic profiler can use it; lib/exec runs it with LibTorch autograd.
//
// Nodes are stored in execution order (builders append them topologically; validate() checks).
// Every tensor has exactly one producer; shapes are concrete for the micro-batch size the graph
// was built for.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "util/dtype.h"

namespace dawnpiper {

enum class OpKind {
  Input,         // data placeholder (token ids, labels, images): loaded, never received
  Embedding,     // params: weight [V, H]; input int64 ids
  PosEmbedding,  // params: weight [S_max, H]; output [S, H] (positions 0..S-1 of input dim 1)
  Linear,        // params: weight [out, in], optional bias [out]; on the last dim; attr rows
                 // {begin, end}: only those rows of the weight (a chunk of a tied projection)
  LayerNorm,     // params: weight, bias [H]; attr eps
  RMSNorm,       // params: weight [H]; attr eps (T5's layer norm: no mean, no bias)
  Gelu,
  Relu,
  Tanh,
  Dropout,        // attr p; mask drawn from (seed, node, step, micro-batch)
  Reshape,        // attr shape (full target shape)
  Transpose,      // attr dims (a permutation)
  MatMul,         // batched matmul of two inputs
  Scale,          // attr factor
  CausalMask,     // masks the upper triangle of the last two dims with -inf
  Softmax,        // over the last dim
  Add,            // elementwise sum of two or more inputs
  Conv2d,         // params: weight [Co, Ci/groups, kh, kw], optional bias; attrs stride,
                  // padding (pair), groups
  BatchNorm2d,    // params: weight, bias [C]; batch statistics (training mode); attr eps
  MaxPool2d,      // attrs kernel, stride, padding
  AvgPool2d,      // attrs kernel, stride, padding (count_include_pad = false)
  Concat,         // attr dim
  GlobalAvgPool,  // mean over H, W: [N, C, H, W] -> [N, C]
  Mul,            // elementwise product of two inputs (broadcasting)
  Sub,            // a - b (broadcasting)
  Div,            // a / b (broadcasting)
  Erf,
  Sqrt,
  Mean,          // mean over the last dim, kept: [.., H] -> [.., 1]
  Affine,        // x * attr scale + attr shift (scalars)
  ScaleShift,    // params: weight, bias [H]: x * weight + bias (a layernorm's affine part)
  RelPosBias,    // params: table [buckets, heads]; T5 relative position bias -> [1, heads, Sq, Sk];
                 // attrs buckets, max_distance, bidirectional; input: any tensor (for S)
  CrossEntropy,  // inputs logits [.., C], labels [..] (int64, -100 ignored) -> scalar mean
  // An LM head and its loss in one node: inputs hidden [.., H], labels [..]; params weight
  // [C, H] (maybe tied), optional bias [C]; attr chunk_tokens. Computes the logits of
  // chunk_tokens positions at a time and recomputes them in backward, so the [.., C] logits are
  // never held whole -> scalar mean, as CrossEntropy.
  LinearCrossEntropy,
  Aten,  // an imported ATen operator call (Node::call): any op torch.export emits, run
         // through the c10 dispatcher; may have several outputs
};

const char* op_kind_name(OpKind kind);
// The label the zoo's losses ignore (at::cross_entropy's default ignore_index).
constexpr int64_t kIgnoredLabel = -100;

// A CrossEntropy writes its fp32 log-probabilities over its logits where nothing else holds
// them (exec/cross_entropy.h), a chunk of rows at a time: ceil(rows / kCrossEntropyChunks) rows
// of the logits are its one transient buffer (plan/stage_replay_walk.cpp counts the same).
constexpr int64_t kCrossEntropyChunks = 64;
inline int64_t cross_entropy_chunk_rows(int64_t rows) { return (rows + kCrossEntropyChunks - 1) / kCrossEntropyChunks; }
// What overwriting fp32 logits saves against a second buffer: all of them but one chunk of rows
// (the labels are int64, one per row).
inline int64_t cross_entropy_overwrite_saving(int64_t logits_bytes, int64_t labels_bytes) {
  const int64_t rows = labels_bytes / 8;
  return rows > 0 ? logits_bytes - cross_entropy_chunk_rows(rows) * (logits_bytes / rows) : 0;
}

// The zoo's loss kinds (CrossEntropy, LinearCrossEntropy): the graph's last node, once.
inline bool is_loss_kind(OpKind kind) { return kind == OpKind::CrossEntropy || kind == OpKind::LinearCrossEntropy; }

using Shape = std::vector<int64_t>;
int64_t numel(const Shape& shape);
std::string shape_str(const Shape& shape);

enum class Init {
  Normal,   // N(0, std^2)
  Uniform,  // U(-bound, bound), bound = std field
  Zeros,
  Ones,
  File,  // read by ParamSpec::source from OpGraph::weight_files (imported models)
};

struct ParamSpec {
  std::string name;  // e.g. "weight"
  Shape shape;
  Init init = Init::Normal;
  double scale = 0.02;  // std for Normal, bound for Uniform
  // Weight tying (GPT-2/BERT output projection = token embedding): this parameter IS
  // graph.nodes[tied_node].params[tied_param]; it owns no storage and is not counted again.
  int tied_node = -1;
  int tied_param = -1;
  bool tied() const { return tied_node >= 0; }
  DType dtype = DType::F32;
  // Imported models: the parameter's PyTorch name (what checkpoints and safetensors files call
  // it) and the other names tied copies go by ("lm_head.weight" for GPT-2's token embedding).
  std::string source;
  std::vector<std::string> aliases;
  int64_t bytes() const { return numel(shape) * dtype_size(dtype); }
};

// A non-trainable tensor an imported model reads (a buffer such as Llama's inv_freq, or a
// constant torch.export lifted): loaded from the weight files, kept once per stage.
struct BufferSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::F32;
  int64_t bytes() const { return numel(shape) * dtype_size(dtype); }
};

// One argument of an imported ATen call, resolved for the graph's micro-batch size. Lists hold
// their elements in `items`; tensors refer to the node's inputs or parameters by position.
struct AtenArg {
  enum class Kind { None, Bool, Int, Real, String, Tensor, Param, Buffer, List, DType, Device, Layout, MemoryFormat };
  Kind kind = Kind::None;
  int64_t i = 0;  // Int, Bool (0/1), Tensor (index in Node::inputs), Param (in Node::params),
                  // Buffer (in OpGraph::buffers), DType (DType value)
  double r = 0;   // Real
  std::string s;  // String, Layout, MemoryFormat (their names)
  std::vector<AtenArg> items;
};

// An imported node's operator call: "aten::linear" with overload "" (default) or "Tensor".
struct AtenCall {
  std::string op, overload;
  std::vector<AtenArg> args;  // every schema argument, in schema order (defaults filled in)
  // Per Node::outputs entry: which of the op's returned tensors it is (tensor lists flattened),
  // and the argument position it is a view of (-1: new storage).
  std::vector<int> result_index, view_of_arg;
  std::string module;  // the PyTorch module path it came from ("transformer.h.0.attn")
  std::string qualified() const { return overload.empty() ? op : op + "." + overload; }
};

struct TensorInfo {
  int id = -1;
  int producer = -1;  // node id
  Shape shape;
  DType dtype = DType::F32;
  std::vector<int> consumers;  // node ids, ascending, unique
  std::string name;
  // Imported graphs: the strides torch.export recorded (empty: derived, graph/layout.h) and
  // whether autograd tracks the tensor (-1: derived from parameters, OpGraph::requires_grad).
  Shape strides;
  int requires_grad = -1;
  int64_t bytes() const { return numel(shape) * dtype_size(dtype); }
};

struct Node {
  int id = -1;
  OpKind kind = OpKind::Input;
  std::string name;          // unique, hierarchical: "layer3.attn.q"
  int block = 0;             // index into OpGraph::blocks (layer / cell granularity)
  std::vector<int> inputs;   // tensor ids, in argument order
  std::vector<int> outputs;  // tensor ids (one for every current kind)
  std::vector<ParamSpec> params;
  std::map<std::string, std::vector<int64_t>> ints;
  std::map<std::string, double> reals;
  // Input nodes: how the data loader fills the tensor (data/synthetic.h: tokens, tokens_next,
  // mlm_tokens, mlm_labels, dec_tokens, image, class, randn, randint), with its parameters in
  // `ints` (vocab, mask_token, high).
  std::string role;
  AtenCall call;  // Aten nodes

  int64_t attr_int(const std::string& key, int64_t fallback) const;
  const std::vector<int64_t>& attr_ints(const std::string& key) const;  // throws if absent
  double attr_real(const std::string& key, double fallback) const;
};

// A constant a stage computes once and keeps for every micro-batch (a causal mask, T5's
// relative-position buckets): nodes with equal keys share one. bytes == 0: the node has none.
struct StageConstant {
  std::string key;
  int64_t bytes = 0;
};

// A tensor crossing a cut: produced before it, consumed at or after it.
struct CrossingTensor {
  int tensor = -1;
  int64_t bytes = 0;
};

class OpGraph {
 public:
  std::string model;             // family: gpt2, bert, t5, amoebanet, mlp
  std::string preset;            // e.g. gpt2-tiny
  int64_t micro_batch_size = 1;  // the B the shapes were built for
  std::vector<Node> nodes;       // execution order
  std::vector<TensorInfo> tensors;
  std::vector<std::string> blocks;  // block names: "embed", "layer0", ..., "head"
  // Imported models: non-trainable tensors, and the safetensors files parameters and buffers
  // are read from (the first that has a name wins: --init-from, then the model file).
  std::vector<BufferSpec> buffers;
  std::vector<std::string> weight_files;
  // "fp32", or "bf16": bf16 compute with fp32 master weights (presets: every floating-point
  // activation bf16, parameters cast at each use, the loss in fp32; imported models: the
  // torch.autocast casts the exporter recorded).
  Precision precision = Precision::Fp32;

  // --- building (used by lib/models) ---
  int add_block(const std::string& name);  // returns block index, becomes the current block
  // Appends a node with one output tensor of `out_shape`; returns the output tensor id.
  int add(OpKind kind, const std::string& name, std::vector<int> inputs, Shape out_shape,
          std::vector<ParamSpec> params = {}, DType out_dtype = DType::F32);
  Node& last() { return nodes.back(); }
  const TensorInfo& tensor(int id) const { return tensors.at(id); }
  // Throws std::logic_error if the graph is malformed (a bug in a builder, not user input):
  // inputs produced later than their consumer, unused non-loss outputs, bad tie references,
  // not exactly one loss node at the end (a cross-entropy, or for imported graphs a scalar).
  void validate() const;

  // --- queries (planner, profiler, runtime) ---
  int size() const { return static_cast<int>(nodes.size()); }
  int loss_node() const { return size() - 1; }
  // Longest path length (in nodes) from any Input node; Input nodes have depth 0.
  std::vector<int> depths() const;
  std::vector<int> consumers_of_node(int node) const;  // node ids consuming any output
  // True for tensors produced by Input nodes: every stage loads them itself (data loader), so
  // they never travel between stages.
  bool is_data(int tensor) const;
  // Non-data tensors produced by nodes [0, cut) and consumed by nodes [cut, size()).
  std::vector<CrossingTensor> crossing(int cut) const;
  int64_t crossing_bytes(int cut) const;
  // Data tensors that nodes [begin, end) read.
  std::vector<int> data_inputs(int begin, int end) const;

  // Which tensors carry gradients: outputs of nodes with parameters or with such inputs.
  std::vector<bool> requires_grad() const;
  int64_t parameter_count() const;          // unique parameters (tied ones counted once)
  int64_t parameter_bytes(int node) const;  // owned (untied) parameter bytes of one node
  // Per node, the node owning the tied parameters it reads (weight tying: GPT-2's LM head reads
  // the token embedding's), -1 where it reads none; a node tying two owners' is a logic error.
  // The profile records it (NodeProfile::tied_owner); schedule/schedule.h's holds_tied_across reads it.
  std::vector<int> tied_owners() const;
  // What a stage holding the node keeps once: a causal mask, T5's buckets, the buffers an
  // imported node reads.
  StageConstant stage_constant(int node) const;
  // The input tensor whose storage output k of `node` may share (a transpose, a reshape, an
  // imported view op), or -1.
  int aliased_input(int node, size_t k) const;
  // Whether output k of `node` may share a parameter's or buffer's storage (a position table's
  // slice, an expanded buffer): it allocates nothing and must never be evicted.
  bool views_weight(int node, size_t k) const;
  bool imported() const { return !weight_files.empty(); }
  // A digest of the graph's structure (node kinds and operators, names, wiring, parameter shapes,
  // dtypes, precision), the same at every micro-batch size: what a profile and a plan were made
  // for. 16 hex digits.
  std::string fingerprint() const;
};

}  // namespace dawnpiper
