#include "models/layer_builder.h"

#include <cmath>
#include <stdexcept>

namespace dawnpiper {

namespace {
ParamSpec param(const std::string& name, Shape shape, Init init, double scale = 0.02) {
  ParamSpec p;
  p.name = name;
  p.shape = std::move(shape);
  p.init = init;
  p.scale = scale;
  return p;
}

Shape broadcast(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()), 1);
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t da = i < out.size() - a.size() ? 1 : a[i - (out.size() - a.size())];
    int64_t db = i < out.size() - b.size() ? 1 : b[i - (out.size() - b.size())];
    if (da != db && da != 1 && db != 1)
      throw std::logic_error("shapes " + shape_str(a) + " and " + shape_str(b) + " do not broadcast");
    out[i] = std::max(da, db);
  }
  return out;
}

int64_t conv_out(int64_t in, int64_t k, int64_t stride, int64_t pad) { return (in + 2 * pad - k) / stride + 1; }
}  // namespace

int LayerBuilder::input(const std::string& name, Shape shape, DType dtype, const std::string& role) {
  const int t = g_.add(OpKind::Input, name, {}, std::move(shape), {}, dtype);
  g_.last().role = role;
  return t;
}

int LayerBuilder::linear(const std::string& name, int x, int64_t out, bool bias, double std) {
  Shape s = shape(x);
  int64_t in = s.back();
  s.back() = out;
  std::vector<ParamSpec> ps{param("weight", {out, in}, Init::Normal, std)};
  if (bias) ps.push_back(param("bias", {out}, Init::Zeros));
  return g_.add(OpKind::Linear, name, {x}, s, ps);
}

ParamSpec LayerBuilder::tied_weight(int owner_node, int owner_param) const {
  const ParamSpec& owner = g_.nodes.at(owner_node).params.at(owner_param);
  ParamSpec w = param("weight", owner.shape, owner.init, owner.scale);
  w.tied_node = owner_node;
  w.tied_param = owner_param;
  return w;
}

int LayerBuilder::tied_linear(const std::string& name, int x, int owner_node, int owner_param, bool bias,
                              int64_t row_begin, int64_t row_end) {
  const ParamSpec& owner = g_.nodes.at(owner_node).params.at(owner_param);
  const ParamSpec w = tied_weight(owner_node, owner_param);
  const bool all_rows = row_begin == 0 && (row_end < 0 || row_end == owner.shape[0]);
  if (row_end < 0) row_end = owner.shape[0];
  if (row_begin < 0 || row_begin >= row_end || row_end > owner.shape[0])
    throw std::logic_error("tied_linear " + name + ": rows [" + std::to_string(row_begin) + ", " +
                           std::to_string(row_end) + ") outside the weight's " + std::to_string(owner.shape[0]));
  Shape s = shape(x);
  s.back() = row_end - row_begin;
  std::vector<ParamSpec> ps{w};
  if (bias) ps.push_back(param("bias", {s.back()}, Init::Zeros));
  const int y = g_.add(OpKind::Linear, name, {x}, s, ps);
  if (!all_rows) g_.last().ints["rows"] = {row_begin, row_end};
  return y;
}

int LayerBuilder::output_projection(const std::string& name, int x, int64_t out, int64_t chunks, int tied_owner,
                                    bool bias) {
  auto part = [&](const std::string& part_name, int64_t begin, int64_t end) {
    return tied_owner >= 0 ? tied_linear(part_name, x, tied_owner, 0, bias, begin, end)
                           : linear(part_name, x, end - begin, bias);
  };
  if (chunks <= 1) return part(name, 0, out);
  std::vector<int> parts;
  for (int64_t i = 0; i < chunks; ++i)
    parts.push_back(part(name + ".chunk" + std::to_string(i), out * i / chunks, out * (i + 1) / chunks));
  return concat(name, std::move(parts), static_cast<int64_t>(shape(x).size()) - 1);
}

int LayerBuilder::embedding(const std::string& name, int ids, int64_t vocab, int64_t dim) {
  Shape s = shape(ids);
  s.push_back(dim);
  return g_.add(OpKind::Embedding, name, {ids}, s, {param("weight", {vocab, dim}, Init::Normal)});
}

int LayerBuilder::tied_embedding(const std::string& name, int ids, int owner_node) {
  const ParamSpec& owner = g_.nodes.at(owner_node).params.at(0);
  ParamSpec w = owner;
  w.tied_node = owner_node;
  w.tied_param = 0;
  Shape s = shape(ids);
  s.push_back(owner.shape[1]);
  return g_.add(OpKind::Embedding, name, {ids}, s, {w});
}

int LayerBuilder::pos_embedding(const std::string& name, int ids, int64_t max_positions, int64_t dim) {
  return g_.add(OpKind::PosEmbedding, name, {ids}, {shape(ids).at(1), dim},
                {param("weight", {max_positions, dim}, Init::Normal, 0.01)});
}

int LayerBuilder::layernorm(const std::string& name, int x, double eps) {
  int64_t h = shape(x).back();
  int y = g_.add(OpKind::LayerNorm, name, {x}, shape(x),
                 {param("weight", {h}, Init::Ones), param("bias", {h}, Init::Zeros)});
  g_.last().reals["eps"] = eps;
  return y;
}

int LayerBuilder::layernorm_unfused(const std::string& name, int x, double eps) {
  Shape reduced = shape(x);
  reduced.back() = 1;
  int mu = g_.add(OpKind::Mean, name + ".mean", {x}, reduced);
  int centered = binary(OpKind::Sub, name + ".center", x, mu);
  int sq = binary(OpKind::Mul, name + ".square", centered, centered);
  int var = g_.add(OpKind::Mean, name + ".var", {sq}, reduced);
  int var_eps = affine(name + ".eps", var, 1.0, eps);
  int stddev = unary(OpKind::Sqrt, name + ".std", var_eps);
  int normed = binary(OpKind::Div, name + ".norm", centered, stddev);
  int64_t h = shape(x).back();
  return g_.add(OpKind::ScaleShift, name + ".affine", {normed}, shape(x),
                {param("weight", {h}, Init::Ones), param("bias", {h}, Init::Zeros)});
}

int LayerBuilder::rmsnorm(const std::string& name, int x, double eps) {
  int y = g_.add(OpKind::RMSNorm, name, {x}, shape(x), {param("weight", {shape(x).back()}, Init::Ones)});
  g_.last().reals["eps"] = eps;
  return y;
}

int LayerBuilder::unary(OpKind kind, const std::string& name, int x) { return g_.add(kind, name, {x}, shape(x)); }

int LayerBuilder::gelu_unfused(const std::string& name, int x) {
  int scaled = scale(name + ".div", x, 1.0 / std::sqrt(2.0));
  int e = unary(OpKind::Erf, name + ".erf", scaled);
  int shifted = affine(name + ".add", e, 1.0, 1.0);
  int prod = binary(OpKind::Mul, name + ".mul", x, shifted);
  return scale(name + ".half", prod, 0.5);
}

int LayerBuilder::dropout(const std::string& name, int x, double p) {
  int y = g_.add(OpKind::Dropout, name, {x}, shape(x));
  g_.last().reals["p"] = p;
  return y;
}

int LayerBuilder::reshape(const std::string& name, int x, Shape s) {
  if (numel(s) != numel(shape(x)))
    throw std::logic_error(name + ": reshape " + shape_str(shape(x)) + " to " + shape_str(s));
  int y = g_.add(OpKind::Reshape, name, {x}, s);
  g_.last().ints["shape"] = s;
  return y;
}

int LayerBuilder::transpose(const std::string& name, int x, std::vector<int64_t> perm) {
  Shape s;
  for (int64_t d : perm) s.push_back(shape(x).at(d));
  int y = g_.add(OpKind::Transpose, name, {x}, s);
  g_.last().ints["dims"] = perm;
  return y;
}

int LayerBuilder::matmul(const std::string& name, int a, int b) {
  Shape s = shape(a);
  const Shape& sb = shape(b);
  if (s.back() != sb[sb.size() - 2]) throw std::logic_error(name + ": matmul shapes");
  s.back() = sb.back();
  return g_.add(OpKind::MatMul, name, {a, b}, s);
}

int LayerBuilder::scale(const std::string& name, int x, double factor) {
  int y = g_.add(OpKind::Scale, name, {x}, shape(x));
  g_.last().reals["factor"] = factor;
  return y;
}

int LayerBuilder::affine(const std::string& name, int x, double scale_, double shift) {
  int y = g_.add(OpKind::Affine, name, {x}, shape(x));
  g_.last().reals["scale"] = scale_;
  g_.last().reals["shift"] = shift;
  return y;
}

int LayerBuilder::binary(OpKind kind, const std::string& name, int a, int b) {
  return g_.add(kind, name, {a, b}, broadcast(shape(a), shape(b)));
}

int LayerBuilder::add(const std::string& name, std::vector<int> xs) {
  Shape s = shape(xs.at(0));
  for (size_t i = 1; i < xs.size(); ++i) s = broadcast(s, shape(xs[i]));
  return g_.add(OpKind::Add, name, std::move(xs), s);
}

int LayerBuilder::softmax(const std::string& name, int x) { return unary(OpKind::Softmax, name, x); }

int LayerBuilder::causal_mask(const std::string& name, int x) { return unary(OpKind::CausalMask, name, x); }

int LayerBuilder::conv2d(const std::string& name, int x, int64_t out_channels, int64_t kh, int64_t kw, int64_t stride,
                         int64_t ph, int64_t pw, bool bias) {
  const Shape& s = shape(x);  // [N, C, H, W]
  int64_t fan_in = s[1] * kh * kw;
  std::vector<ParamSpec> ps{param("weight", {out_channels, s[1], kh, kw}, Init::Normal, std::sqrt(2.0 / fan_in))};
  if (bias) ps.push_back(param("bias", {out_channels}, Init::Zeros));
  Shape out{s[0], out_channels, conv_out(s[2], kh, stride, ph), conv_out(s[3], kw, stride, pw)};
  int y = g_.add(OpKind::Conv2d, name, {x}, out, ps);
  g_.last().ints["stride"] = {stride, stride};
  g_.last().ints["padding"] = {ph, pw};
  return y;
}

int LayerBuilder::batchnorm2d(const std::string& name, int x, double eps) {
  int64_t c = shape(x)[1];
  int y = g_.add(OpKind::BatchNorm2d, name, {x}, shape(x),
                 {param("weight", {c}, Init::Ones), param("bias", {c}, Init::Zeros)});
  g_.last().reals["eps"] = eps;
  return y;
}

int LayerBuilder::pool2d(OpKind kind, const std::string& name, int x, int64_t kernel, int64_t stride, int64_t padding) {
  Shape s = shape(x);
  s[2] = conv_out(s[2], kernel, stride, padding);
  s[3] = conv_out(s[3], kernel, stride, padding);
  int y = g_.add(kind, name, {x}, s);
  g_.last().ints["kernel"] = {kernel};
  g_.last().ints["stride"] = {stride};
  g_.last().ints["padding"] = {padding};
  return y;
}

int LayerBuilder::concat(const std::string& name, std::vector<int> xs, int64_t dim) {
  Shape s = shape(xs.at(0));
  for (size_t i = 1; i < xs.size(); ++i) s[dim] += shape(xs[i])[dim];
  int y = g_.add(OpKind::Concat, name, std::move(xs), s);
  g_.last().ints["dim"] = {dim};
  return y;
}

int LayerBuilder::global_avgpool(const std::string& name, int x) {
  return g_.add(OpKind::GlobalAvgPool, name, {x}, {shape(x)[0], shape(x)[1]});
}

int LayerBuilder::rel_pos_bias(const std::string& name, int x, int64_t heads, int64_t buckets, int64_t max_distance,
                               bool bidirectional, int64_t sq, int64_t sk) {
  int y =
      g_.add(OpKind::RelPosBias, name, {x}, {1, heads, sq, sk}, {param("table", {buckets, heads}, Init::Normal, 0.02)});
  g_.last().ints["buckets"] = {buckets};
  g_.last().ints["max_distance"] = {max_distance};
  g_.last().ints["bidirectional"] = {bidirectional ? 1 : 0};
  return y;
}

int LayerBuilder::cross_entropy(const std::string& name, int logits, int labels) {
  return g_.add(OpKind::CrossEntropy, name, {logits, labels}, {});
}

int LayerBuilder::linear_cross_entropy(const std::string& name, int x, int labels, int64_t classes, int tied_owner,
                                       bool bias, int64_t chunk_tokens) {
  if (chunk_tokens < 1) throw std::logic_error("linear_cross_entropy " + name + ": chunk_tokens must be positive");
  std::vector<ParamSpec> ps{tied_owner >= 0 ? tied_weight(tied_owner, 0)
                                            : param("weight", {classes, shape(x).back()}, Init::Normal, 0.02)};
  if (bias) ps.push_back(param("bias", {classes}, Init::Zeros));
  const int y = g_.add(OpKind::LinearCrossEntropy, name, {x, labels}, {}, ps);
  g_.last().ints["chunk_tokens"] = {chunk_tokens};
  return y;
}

int LayerBuilder::scaled_dot_product_attention(const std::string& name, int q, int k, int v, int mask, double dropout,
                                               bool causal, double scale) {
  auto tensor = [](int64_t i) { return AtenArg{AtenArg::Kind::Tensor, i, 0, {}, {}}; };
  std::vector<int> inputs{q, k, v};
  AtenCall call;
  call.op = "aten::scaled_dot_product_attention";
  call.args = {tensor(0), tensor(1), tensor(2), AtenArg{}};
  if (mask >= 0) call.args[3] = tensor(3), inputs.push_back(mask);
  call.args.push_back(AtenArg{AtenArg::Kind::Real, 0, dropout, {}, {}});
  call.args.push_back(AtenArg{AtenArg::Kind::Bool, causal ? 1 : 0, 0, {}, {}});
  call.args.push_back(AtenArg{AtenArg::Kind::Real, 0, scale, {}, {}});
  call.args.push_back(AtenArg{AtenArg::Kind::Bool, 0, 0, {}, {}});  // enable_gqa
  call.result_index = {0};
  call.view_of_arg = {-1};
  const int y = g_.add(OpKind::Aten, name, std::move(inputs), shape(q), {});
  g_.last().call = std::move(call);
  return y;
}

}  // namespace dawnpiper
