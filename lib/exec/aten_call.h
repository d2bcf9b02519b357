#pragma once
// Running an imported node's ATen call through the c10 dispatcher, boxed, exactly as eager
// PyTorch would (autograd included), so any operator torch.export emits runs.
#include <functional>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "graph/op_graph.h"

namespace dawnpiper {

class AtenKernel {
 public:
  // Finds the operator and checks the recorded arguments against its schema; throws ConfigError
  // naming the node and the operator when this LibTorch does not know it or the arguments do
  // not fit.
  explicit AtenKernel(const Node& node);
  // Random ops (tagged nondeterministic_seeded: dropout, attention with its dropout_p, ...):
  // the caller seeds the device's generator before each call, so a recomputation and every
  // schedule draw the same numbers.
  bool seeded() const { return seeded_; }
  // Calls the operator. `tensor` resolves Tensor, Param and Buffer arguments; Device arguments
  // become `device`; no_dropout sets a dropout_p argument to 0 (evaluation). Returns the node's
  // outputs (Node::outputs order).
  std::vector<at::Tensor> call(const Node& node, const std::function<at::Tensor(const AtenArg&)>& tensor,
                               at::Device device, bool no_dropout = false) const;

 private:
  std::optional<c10::OperatorHandle> op_;
  bool seeded_ = false;
  int dropout_arg_ = -1;  // the schema's dropout_p argument, if any
};

}  // namespace dawnpiper
