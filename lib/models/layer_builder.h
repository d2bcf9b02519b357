#pragma once
// Shape-computing helpers the model builders share: each call appends one OpGraph node (or a
// short, fixed sequence of nodes) and returns the output tensor id.
#include <string>

#include "graph/op_graph.h"

namespace dawnpiper {

class LayerBuilder {
 public:
  explicit LayerBuilder(OpGraph& graph) : g_(graph) {}
  OpGraph& graph() { return g_; }
  const Shape& shape(int t) const { return g_.tensor(t).shape; }

  // role: how the data loader fills it (Node::role, data/synthetic.h)
  int input(const std::string& name, Shape shape, DType dtype, const std::string& role = "");
  int linear(const std::string& name, int x, int64_t out, bool bias = true, double std = 0.02);
  // A linear whose weight is another node's parameter (output projection tied to an embedding),
  // or rows [row_begin, row_end) of it (row_end < 0: all rows).
  int tied_linear(const std::string& name, int x, int owner_node, int owner_param, bool bias, int64_t row_begin = 0,
                  int64_t row_end = -1);
  // The output projection onto `out` classes: one linear, or with chunks > 1 that many over
  // consecutive row ranges of the weight ("name.chunk<i>") and their concat ("name"), so that a
  // cut may fall inside it. tied_owner >= 0: the weight is that node's parameter 0.
  int output_projection(const std::string& name, int x, int64_t out, int64_t chunks, int tied_owner, bool bias);
  int embedding(const std::string& name, int ids, int64_t vocab, int64_t dim);
  int tied_embedding(const std::string& name, int ids, int owner_node);
  int pos_embedding(const std::string& name, int ids, int64_t max_positions, int64_t dim);
  int layernorm(const std::string& name, int x, double eps = 1e-5);
  // LayerNorm written out as primitive ops (mean, sub, mul, mean, affine, sqrt, div, scale_shift),
  // as in the original PyTorch BERT port: every intermediate is its own saved activation.
  int layernorm_unfused(const std::string& name, int x, double eps = 1e-12);
  int rmsnorm(const std::string& name, int x, double eps = 1e-6);
  int unary(OpKind kind, const std::string& name, int x);
  // gelu(x) = x * 0.5 * (1 + erf(x / sqrt(2))), one node per op.
  int gelu_unfused(const std::string& name, int x);
  int dropout(const std::string& name, int x, double p);
  int reshape(const std::string& name, int x, Shape shape);
  int transpose(const std::string& name, int x, std::vector<int64_t> perm);
  int matmul(const std::string& name, int a, int b);
  int scale(const std::string& name, int x, double factor);
  int affine(const std::string& name, int x, double scale, double shift);
  int binary(OpKind kind, const std::string& name, int a, int b);  // Add/Mul/Sub/Div
  int add(const std::string& name, std::vector<int> xs);
  int softmax(const std::string& name, int x);
  int causal_mask(const std::string& name, int x);
  int conv2d(const std::string& name, int x, int64_t out_channels, int64_t kh, int64_t kw, int64_t stride, int64_t ph,
             int64_t pw, bool bias = false);
  int batchnorm2d(const std::string& name, int x, double eps = 1e-5);
  int pool2d(OpKind kind, const std::string& name, int x, int64_t kernel, int64_t stride, int64_t padding);
  int concat(const std::string& name, std::vector<int> xs, int64_t dim);
  int global_avgpool(const std::string& name, int x);
  int rel_pos_bias(const std::string& name, int x, int64_t heads, int64_t buckets, int64_t max_distance,
                   bool bidirectional, int64_t sq, int64_t sk);
  int cross_entropy(const std::string& name, int logits, int labels);
  // Attention over heads, q/k/v [B, heads, S, head_dim], as one aten::scaled_dot_product_attention
  // call (an OpKind::Aten node); mask: an additive bias or -1; causal only without a mask.
  int scaled_dot_product_attention(const std::string& name, int q, int k, int v, int mask, double dropout, bool causal,
                                   double scale);
  // An output projection onto `classes` and its cross-entropy against `labels` as one node
  // (OpKind::LinearCrossEntropy) that holds the logits of chunk_tokens positions at a time.
  // tied_owner >= 0: the weight is that node's parameter 0.
  int linear_cross_entropy(const std::string& name, int x, int labels, int64_t classes, int tied_owner, bool bias,
                           int64_t chunk_tokens);

 private:
  // A weight that is another node's parameter (weight tying), named "weight".
  ParamSpec tied_weight(int owner_node, int owner_param) const;

  OpGraph& g_;
};

}  // namespace dawnpiper
