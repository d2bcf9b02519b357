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

namespace dawnpiper {

enum class OpKind {
  Input,          // data placeholder (token ids, labels, images): loaded, never received
  Embedding,      // params: weight [V, H]; input int64 ids
  PosEmbedding,   // params: weight [S_max, H]; output [S, H] (positions 0..S-1 of input dim 1)
  Linear,         // params: weight [out, in], optional bias [out]; on the last dim
  LayerNorm,      // params: weight, bias [H]; attr eps
  RMSNorm,        // params: weight [H]; attr eps (T5's layer norm: no mean, no bias)
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
  Mean,           // mean over the last dim, kept: [.., H] -> [.., 1]
  Affine,         // x * attr scale + attr shift (scalars)
  ScaleShift,     // params: weight, bias [H]: x * weight + bias (a layernorm's affine part)
  RelPosBias,     // params: table [buckets, heads]; T5 relative position bias -> [1, heads, Sq, Sk];
                  // attrs buckets, max_distance, bidirectional; input: any tensor (for S)
  CrossEntropy,   // inputs logits [.., C], labels [..] (int64, -100 ignored) -> scalar mean
};

const char* op_kind_name(OpKind kind);
OpKind op_kind_from_name(const std::string& name);  // throws ConfigError if unknown
int op_kind_count();                                // number of OpKind values

enum class DType { F32, I64 };
int dtype_size(DType dtype);

using Shape = std::vector<int64_t>;
int64_t numel(const Shape& shape);
std::string shape_str(const Shape& shape);

enum class Init {
  Normal,   // N(0, std^2)
  Uniform,  // U(-bound, bound), bound = std field
  Zeros,
  Ones,
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
};

struct TensorInfo {
  int id = -1;
  int producer = -1;   // node id
  Shape shape;
  DType dtype = DType::F32;
  std::vector<int> consumers;  // node ids, ascending, unique
  std::string name;
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

  // --- building (used by lib/models) ---
  int add_block(const std::string& name);  // returns block index, becomes the current block
  // Appends a node with one output tensor of `out_shape`; returns the output tensor id.
  int add(OpKind kind, const std::string& name, std::vector<int> inputs, Shape out_shape,
          std::vector<ParamSpec> params = {}, DType out_dtype = DType::F32);
  Node& last() { return nodes.back(); }
  const TensorInfo& tensor(int id) const { return tensors.at(id); }
  // Throws std::logic_error if the graph is malformed (a bug in a builder, not user input):
  // inputs produced later than their consumer, unused non-loss outputs, bad tie references,
  // not exactly one loss node at the end.
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
  int64_t parameter_count() const;  // unique parameters (tied ones counted once)
  int64_t parameter_bytes(int node) const;  // owned (untied) parameter bytes of one node
  StageConstant stage_constant(int node) const;
};

}  // namespace dawnpiper
