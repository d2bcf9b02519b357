#pragma once
// The backward of one micro-batch split in two on its own autograd graph (zero-bubble
// schedules, schedule/zero_bubble.cpp):
//   input pass   from the stage's roots (its sent outputs with their received gradients, or the
//                loss) to the stage's received inputs and to the outputs of every node that reads
//                parameters; the graph is kept while it runs, then the other nodes' functions
//                let what they saved go: the gradients arriving at those outputs and what those
//                nodes saved stay for the weight pass;
//   weight pass  for each such node, from its outputs with the held gradients to its own
//                parameters only, accumulating into their .grad; the graph is let go after it.
// The forward records the nodes' outputs as gradient edges, which hold no tensor: a split run
// keeps no activation an unsplit one frees before its backward.
// Exact where no parameter is read by two nodes one of which feeds the other within the stage
// (the weight pass of the later one would reach the parameter through the earlier one too and
// count its part twice); the constructor refuses such stages, unless told the split only times
// the passes (the profiler: then the input pass keeps every saved tensor, as W may pass through
// any node).
#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/edge.h>

#include "data/tensor_env.h"
#include "exec/stage_module.h"

namespace dawnpiper {

// One micro-batch's state between its input pass and its weight pass.
struct WeightRoots {
  std::vector<torch::autograd::Edge> edges;  // outputs of parameter-reading nodes, in forward order
  std::vector<int> node;                     // per edge: its node
  std::vector<at::Tensor> grads;             // per edge, after the input pass (undefined: none arrived)
  // Per node of the stage: autograd's sequence number after its forward (its functions have
  // numbers below it and at or above the previous node's).
  std::vector<uint64_t> node_end_seq;
};

class SplitBackward {
 public:
  // Throws ConfigError naming the parameter and the two nodes where the split would not be exact.
  SplitBackward(const StageModule& module, int stage, bool exact = true);

  // After node n's forward (StageModule::forward's after_node), for every node: records where its
  // autograd functions end and, for a node reading parameters, its outputs' edges.
  void record(int node, const TensorEnv& env, WeightRoots& roots) const;
  // The input pass. Returns the gradients of `inputs` (undefined where none flowed) and leaves
  // those of the recorded edges in roots.grads.
  std::vector<at::Tensor> input_pass(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& grads,
                                     const std::vector<at::Tensor>& inputs, WeightRoots& roots) const;
  // The weight pass: each recorded node's parameters get their gradients; roots is emptied.
  // before_node, when set, runs before each node's part (the profiler's timing).
  void weight_pass(WeightRoots& roots, const std::function<void(int node)>& before_node = {}) const;

 private:
  // Copies the gradients that hold a larger buffer than their own (see there).
  static void own_slices(std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& roots);
  // Every function reachable from `from` that no parameter-reading node made lets what it saved go.
  void release_unread(const std::vector<torch::autograd::Edge>& from, const WeightRoots& roots) const;

  const StageModule& module_;
  std::vector<std::vector<int>> reads_;  // node offset -> parameters it reads (empty: none)
  bool exact_;
};

}  // namespace dawnpiper
