// OpGraph invariants and queries on hand-built graphs.
#include <catch2/catch.hpp>

#include <set>

#include "graph/layout.h"
#include "graph/op_graph.h"
#include "models/layer_builder.h"

using namespace dawnpiper;

namespace {
// x -> a -> b -> c -> loss, with a skip edge a -> c (c = add(a, b)) and labels read by the loss.
OpGraph diamond() {
  OpGraph g;
  g.preset = "diamond";
  LayerBuilder b(g);
  int x = b.input("features", {2, 8}, DType::F32);
  int a = b.linear("a", x, 8);
  int r = b.unary(OpKind::Relu, "b", a);
  int c = b.add("c", {a, r});
  int logits = b.linear("head", c, 3);
  int labels = b.input("labels", {2}, DType::I64);
  b.cross_entropy("loss", logits, labels);
  g.validate();
  return g;
}
}  // namespace

TEST_CASE("crossing sets on a hand-built graph", "[graph]") {
  OpGraph g = diamond();
  REQUIRE(g.size() == 7);
  // Cut before node 2 (relu): only a's output crosses (x is data, never sent).
  auto c2 = g.crossing(2);
  REQUIRE(c2.size() == 1);
  CHECK(c2[0].tensor == 1);
  CHECK(c2[0].bytes == 2 * 8 * 4);
  // Cut before node 3 (add): a's output (skip edge) and relu's output both cross.
  auto c3 = g.crossing(3);
  std::set<int> ids;
  for (auto& c : c3) ids.insert(c.tensor);
  CHECK(ids == std::set<int>{1, 2});
  CHECK(g.crossing_bytes(3) == 2 * 2 * 8 * 4);
  // Cut before the loss: logits cross, labels do not (data).
  auto c6 = g.crossing(6);
  REQUIRE(c6.size() == 1);
  CHECK(c6[0].tensor == 4);
  CHECK(g.data_inputs(6, 7) == std::vector<int>{5});
  CHECK(g.crossing(0).empty());
  CHECK(g.crossing(g.size()).empty());
}

TEST_CASE("depths and consumers", "[graph]") {
  OpGraph g = diamond();
  auto d = g.depths();
  CHECK(d[0] == 0);
  CHECK(d[1] == 1);
  CHECK(d[2] == 2);
  CHECK(d[3] == 3);  // longest path through the relu
  CHECK(d[5] == 0);  // labels
  CHECK(d[6] == 5);
  CHECK(g.consumers_of_node(1) == std::vector<int>{2, 3});
}

TEST_CASE("validate rejects malformed graphs", "[graph]") {
  OpGraph g;
  LayerBuilder b(g);
  int x = b.input("x", {2, 4}, DType::F32);
  b.linear("unused", x, 4);  // output never read
  int y = b.linear("y", x, 3);
  int labels = b.input("labels", {2}, DType::I64);
  b.cross_entropy("loss", y, labels);
  CHECK_THROWS_AS(g.validate(), std::logic_error);

  OpGraph h;
  LayerBuilder hb(h);
  int hx = hb.input("x", {2, 4}, DType::F32);
  hb.linear("y", hx, 3);
  CHECK_THROWS_AS(h.validate(), std::logic_error);  // no loss node at the end
}

TEST_CASE("parameter counting skips tied parameters", "[graph]") {
  OpGraph g;
  LayerBuilder b(g);
  int ids = b.input("tokens", {2, 5}, DType::I64);
  int e = b.embedding("emb", ids, 11, 4);
  int logits = b.tied_linear("head", e, g.tensor(e).producer, 0, true);
  int labels = b.input("labels", {2, 5}, DType::I64);
  b.cross_entropy("loss", logits, labels);
  g.validate();
  CHECK(g.parameter_count() == 11 * 4 + 11);  // embedding once, plus the head's bias
  CHECK(g.tensor(logits).shape == Shape{2, 5, 11});
}

// What a receiver lays a tensor out as when the transport delivers it contiguous: a transposed
// slice of a fused projection ([4, 16, 96] viewed as [4, 4, 16, 16] heads, then transposed)
// keeps its dimension order, densely; an expanded dimension has no order to keep.
TEST_CASE("dense strides keep a strided tensor's dimension order", "[graph]") {
  CHECK(dense_strides_like({4, 4, 16, 16}, {1536, 16, 96, 1}) == Strides{1024, 16, 64, 1});
  CHECK(dense_strides_like({2, 3}, {3, 1}) == Strides{3, 1});
  CHECK(dense_strides_like({4, 4, 16, 16}, {256, 0, 16, 1}).empty());
}

// The layout a stage gives a received tensor (runtime/pipeline_stage.cpp; the profile records
// whether it does, TensorProfile::relaid_on_receipt): a transposed view's dimension order, of a
// whole tensor or of a slice of a wider one; nothing for what stays contiguous (a contiguous
// tensor, a slice in dimension order, an expanded dimension, a zoo graph's empty strides).
TEST_CASE("a received tensor is laid out again only where its dimension order is permuted", "[graph]") {
  CHECK(receipt_layout({4, 4, 16, 16}, {1024, 16, 64, 1}) == Strides{1024, 16, 64, 1});   // a transpose
  CHECK(receipt_layout({4, 4, 16, 16}, {3072, 48, 192, 1}) == Strides{1024, 16, 64, 1});  // of a slice
  CHECK(receipt_layout({4, 16, 4, 16}, {3072, 192, 48, 1}).empty());                      // a slice in dimension order
  CHECK(receipt_layout({4, 4, 16, 16}, {1024, 256, 16, 1}).empty());                      // contiguous
  CHECK(receipt_layout({4, 4, 16, 16}, {256, 0, 16, 1}).empty());                         // expanded
  CHECK(receipt_layout({4, 4, 16, 16}, {}).empty());                                      // a zoo graph's
}
