#pragma once
// Memory layout of every graph tensor as the executor produces it when the whole graph runs on
// one device: views (transpose, viewable reshape) keep their base's layout, everything else is
// contiguous. The analytic profile uses it to know which reshapes copy; a stage uses it to copy
// where the whole graph would, although its received inputs arrive contiguous.
#include <cstdint>
#include <vector>

#include "graph/op_graph.h"

namespace dawnpiper {

using Strides = std::vector<int64_t>;

Strides contiguous_strides(const Shape& shape);
// Whether (shape, strides) lays the elements out contiguously (dimensions of size 1 ignored).
bool is_contiguous(const Shape& shape, const Strides& strides);
// Whether the strides lay the elements out densely without overlap in some dimension order (a
// permuted contiguous tensor, e.g. a transpose of a contiguous one).
bool is_dense(const Shape& shape, const Strides& strides);
// Dense strides with the dimension order of `strides` (the largest stride outermost; ties in
// dimension order): a slice of a wider tensor, transposed, becomes the same transpose of a
// tensor of its own. Empty where a dimension is expanded (stride 0): no order to keep.
Strides dense_strides_like(const Shape& shape, const Strides& strides);
// The layout a stage gives a received tensor that the whole graph lays out as `strides`
// (torch.export's; empty: a zoo graph's, contiguous): its dimension order, dense, where that is
// not the contiguous order (a transpose, of a whole tensor or of a slice of a wider one), so
// that the stage's kernels copy and view where the whole graph's do. Empty where the tensor
// arrives and stays contiguous.
Strides receipt_layout(const Shape& shape, const Strides& strides);
std::vector<Strides> tensor_strides(const OpGraph& g);
// Whether `to` can view tensor `input` laid out as `st[input]` (ATen's computeStride rule,
// which decides whether reshape views or copies).
bool reshape_is_view(const OpGraph& g, const std::vector<Strides>& st, int input, const Shape& to);
// The inputs a batched matmul copies: ATen folds each operand's batch dimensions into one, and
// an operand whose layout does not allow that view becomes a contiguous copy, which autograd
// keeps instead of the operand. A stage that receives such an operand gets it contiguous and
// copies nothing.
std::vector<int> matmul_copied_inputs(const OpGraph& g, const std::vector<Strides>& st, int node);

}  // namespace dawnpiper
