#pragma once
// The parts of building a Profile from an OpGraph that the measured profiler and the analytic
// one share: the graph's facts, recording what a backward keeps, and the finishing pass.
#include <string>
#include <vector>

#include "graph/layout.h"
#include "graph/op_graph.h"
#include "profile/profile.h"

namespace dawnpiper {

// The graph's tensors (bytes, producers, consumers, data flags), blocks and provenance; no
// node rows yet.
Profile profile_skeleton(const OpGraph& graph, const std::string& source, const std::string& device);
// A node row with the graph's facts (name, kind, block, depth, parameter bytes, outputs).
NodeProfile node_row(const OpGraph& graph, int node, const std::vector<int>& depths);
// Records that `node`'s backward keeps tensor `tensor`: on its storage owner, if it is a view.
void add_saved(Profile& profile, int tensor, int node);
// Appends an internal buffer of `bytes` that only `node`'s backward keeps (TensorProfile::copy_of:
// the input it copies, if it is such a copy).
void add_internal(Profile& profile, int node, int64_t bytes, int copy_of = -1);
// Appends `node`'s internal buffers, `bytes` in all: first the copies of inputs the node makes
// (graph/layout.h's matmul_copied_inputs), as far as `bytes` covers them, then the rest.
void add_internals(Profile& profile, const OpGraph& graph, const std::vector<Strides>& strides, int node, int64_t bytes);
// Places parameter gradients (tied weights at their last user), the largest parameter, the
// nodes' saved lists, and flat fits for whatever has none yet.
void finish_profile(Profile& profile, const OpGraph& graph);

}  // namespace dawnpiper
