#pragma once
// The parts of building a Profile from an OpGraph that the measured profiler and the analytic
// one share: the graph's facts, recording what a backward keeps, and the finishing pass.
#include <functional>
#include <string>
#include <vector>

#include "graph/layout.h"
#include "graph/op_graph.h"
#include "profile/profile.h"

namespace dawnpiper {

// The graph's tensors (bytes, producers, consumers, data flags), blocks and provenance; no
// node rows yet.
Profile profile_skeleton(const OpGraph& graph, ProfileSource source, const std::string& device);
// A node row with the graph's facts (name, kind, block, depth, parameter bytes, outputs).
NodeProfile node_row(const OpGraph& graph, int node, const std::vector<int>& depths,
                     const std::vector<int>& tied_owners);
// Records that `node`'s backward keeps tensor `tensor`: on its storage owner, if it is a view.
void add_saved(Profile& profile, int tensor, int node);
// Appends an internal buffer of `bytes` that only `node`'s backward keeps (TensorProfile::copy_of:
// the input it copies, if it is such a copy).
void add_internal(Profile& profile, int node, int64_t bytes, int copy_of = -1);
// Appends `node`'s internal buffers, `bytes` in all: first the copies of inputs the node makes
// (graph/layout.h's matmul_copied_inputs), as far as `bytes` covers them, then the rest.
void add_internals(Profile& profile, const OpGraph& graph, const std::vector<Strides>& strides, int node,
                   int64_t bytes);
// What autograd keeps for one node, as the measured profiler reads it off a run of the node
// alone: the analytic profile's fallback for operators it has no formula for.
struct KeptFacts {
  std::vector<int> saved_inputs;        // tensor ids the backward keeps
  std::vector<char> output_saved;       // per output (Node::outputs order)
  std::vector<int> output_alias_of;     // per output: the input tensor whose storage it shares, -1
  std::vector<char> output_param_view;  // per output: a view of a parameter
  std::vector<char> output_contiguous;  // per output: its layout is contiguous
  std::vector<Strides> output_strides;  // per output: its strides, as the kernel made them
  int64_t internal_bytes = 0, fwd_workspace = 0, bwd_workspace = 0;
  int64_t bwd_input_workspace = -1;  // NodeProfile::bwd_input_workspace; -1: not measured
  bool passes_gradient = false;      // NodeProfile::passes_gradient
};
using MeasureNode = std::function<KeptFacts(const OpGraph& graph, int node)>;

// Byte sizes of one tensor at the profiled batch sizes that have it.
struct ByteSamples {
  std::vector<double> x, y;
};
// Samples of every tensor of `base` (a copy of profiles.front()) over `profiles`, one per batch
// size. Graph tensors match by id; internal buffers by producer, the input they copy and their
// order among such buffers. Buffers only other sizes have are appended to `base` first, with 0
// bytes at its size: a batched matmul copies an operand from batch 2 on, not at batch 1, where
// the batch dimension folds away.
std::vector<ByteSamples> batch_byte_samples(Profile& base, const std::vector<Profile>& profiles,
                                            const std::vector<int64_t>& sizes);
// Least-squares line; a single point gives a flat line.
LinearFit fit_line(const std::vector<double>& x, const std::vector<double>& y);
// A workspace's fit: the same line over the profiled sizes held at full_at (a fused loss's
// NodeProfile::workspace_full_at, 0: none), as Profile::at_batch reads it, so sizes on both
// sides of it fit the growing part and the flat part is its end.
LinearFit fit_workspace(std::vector<double> x, const std::vector<double>& y, double full_at);
// The line through a tensor's samples; one sample: proportional to the batch size.
LinearFit fit_bytes(const ByteSamples& samples);
// Places parameter gradients (tied weights at their last user), the largest parameter, the
// nodes' saved lists, and flat fits for whatever has none yet.
void finish_profile(Profile& profile, const OpGraph& graph);

}  // namespace dawnpiper
