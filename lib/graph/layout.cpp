#include "graph/layout.h"

#include <algorithm>

namespace dawnpiper {

Strides contiguous_strides(const Shape& shape) {
  Strides s(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
  return s;
}

bool is_contiguous(const Shape& shape, const Strides& strides) {
  int64_t expected = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    if (shape[static_cast<size_t>(i)] == 1) continue;
    if (strides[static_cast<size_t>(i)] != expected) return false;
    expected *= shape[static_cast<size_t>(i)];
  }
  return true;
}

bool is_dense(const Shape& shape, const Strides& strides) {
  std::vector<size_t> order;
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] != 1) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return strides[a] < strides[b]; });
  int64_t expected = 1;
  for (size_t i : order) {
    if (strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

Strides dense_strides_like(const Shape& shape, const Strides& strides) {
  std::vector<size_t> order(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] != 1 && strides[i] == 0) return {};
    order[i] = i;
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return strides[a] > strides[b]; });
  Strides out(shape.size(), 1);
  int64_t next = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) out[*it] = next, next *= std::max<int64_t>(1, shape[*it]);
  return out;
}

Strides receipt_layout(const Shape& shape, const Strides& strides) {
  if (strides.empty() || is_contiguous(shape, strides)) return {};
  Strides layout = dense_strides_like(shape, strides);
  if (layout.empty() || is_contiguous(shape, layout)) return {};
  return layout;
}

namespace {

// Strides of `new_shape` viewing a tensor of (shape, strides) without a copy, if possible
// (the rule of ATen's computeStride, which decides whether reshape views or copies).
bool view_strides(const Shape& shape, const Strides& strides, const Shape& new_shape, Strides& out) {
  out.assign(new_shape.size(), 0);
  if (shape.empty()) return false;
  int view_d = static_cast<int>(new_shape.size()) - 1;
  int64_t chunk_base = strides.back(), tensor_numel = 1, view_numel = 1;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= shape[d];
    if (d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

}  // namespace

std::vector<Strides> tensor_strides(const OpGraph& g) {
  std::vector<Strides> st(g.tensors.size());
  for (const Node& n : g.nodes) {
    if (n.kind == OpKind::Aten || n.kind == OpKind::Input) {  // imported: as torch.export recorded
      for (int out : n.outputs)
        st[out] = g.tensor(out).strides.empty() ? contiguous_strides(g.tensor(out).shape) : g.tensor(out).strides;
      continue;
    }
    const int out = n.outputs[0];
    const Shape& shape = g.tensor(out).shape;
    st[out] = contiguous_strides(shape);
    if (n.kind == OpKind::Transpose) {
      const auto& dims = n.attr_ints("dims");
      for (size_t i = 0; i < dims.size(); ++i) st[out][i] = st[n.inputs[0]][dims[i]];
    } else if (n.kind == OpKind::Reshape) {
      Strides v;
      if (view_strides(g.tensor(n.inputs[0]).shape, st[n.inputs[0]], shape, v)) st[out] = v;
    }
  }
  return st;
}

bool reshape_is_view(const OpGraph& g, const std::vector<Strides>& st, int input, const Shape& to) {
  Strides v;
  return view_strides(g.tensor(input).shape, st[input], to, v);
}

std::vector<int> matmul_copied_inputs(const OpGraph& g, const std::vector<Strides>& st, int node) {
  std::vector<int> copied;
  const Node& n = g.nodes.at(node);
  if (n.kind != OpKind::MatMul && !(n.kind == OpKind::Aten && n.call.op == "aten::matmul")) return copied;
  for (int in : n.inputs) {
    const Shape& s = g.tensor(in).shape;
    if (s.size() < 3) continue;  // a matrix or vector operand: nothing to fold
    int64_t all = 1;
    for (int64_t d : s) all *= d;
    const Shape folded{all / (s[s.size() - 2] * s.back()), s[s.size() - 2], s.back()};
    if (!reshape_is_view(g, st, in, folded)) copied.push_back(in);
  }
  return copied;
}

}  // namespace dawnpiper
