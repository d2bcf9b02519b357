#pragma once
// The measured profiler: runs every node of an OpGraph in isolation with LibTorch autograd and
// records its forward/backward time, output bytes, what autograd saved for its backward (which
// inputs, whether its output, and internal buffers), parameter bytes and transient peaks. Only
// one node's inputs, parameters and outputs exist at a time, so models far larger than the
// machine's memory can be profiled. Times come from whole steps when the model fits
// (in-step timing), since isolated nodes run faster than in training.
#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "graph/op_graph.h"
#include "models/model_source.h"
#include "profile/profile.h"
#include "profile/profile_builder.h"
#include "train/optimizer_kind.h"
#include "util/enum_names.h"

namespace dawnpiper {

// profile --timing: node times taken inside whole training steps, or each node timed alone.
enum class NodeTiming { InStep, Isolated };
template <>
struct EnumNames<NodeTiming> {
  static constexpr const char* what = "node timing";
  static constexpr std::array<std::pair<NodeTiming, const char*>, 2> table{
      {{NodeTiming::InStep, "in-step"}, {NodeTiming::Isolated, "isolated"}}};
};

struct ProfilerOptions {
  int warmup = 2;      // iterations per node not measured
  int iterations = 5;  // measured iterations per node (mean and standard deviation)
  uint64_t seed = 42;
  c10::Device device = c10::Device(c10::kCPU);
  // Profile only the first of identical transformer layers / cells and reuse its numbers for
  // the others (their nodes match by kind, shapes and parameter shapes).
  bool share_repeated_blocks = false;
  bool progress = false;  // print a line per block to stderr
  // Take per-node times from whole training steps (profile/in_step_timing.h) when the step fits
  // the device; otherwise, or when false, from the isolated per-node runs.
  bool in_step_timing = true;  // NodeTiming::InStep
  // Time the optimizers' updates (profile/measure_updates.h): once per model, they do not depend
  // on the micro-batch size.
  bool measure_updates = true;
};

// Profiles one graph (one micro-batch size). Fits are flat (base = value, per_sample = 0).
Profile profile_graph(const OpGraph& graph, const ProfilerOptions& options);

// Profiles `config` at each of `batch_sizes` (at least one; two or more give a batch-size fit)
// and returns the profile at batch_sizes.front() with linear fits of every byte and time figure
// over the batch sizes and the fits' worst relative error.
Profile profile_model(const ModelSource& model, std::vector<int64_t> batch_sizes, const ProfilerOptions& options);

struct StepMeasurement {
  double step_ms = 0;      // median of the measured steps: forward + backward + optimizer
  double fwd_bwd_ms = 0;   // median of forward + backward alone (what the node times sum to)
  int64_t peak_bytes = 0;  // peak live bytes in the last measured step
};

// What autograd keeps for one node, measured by running it alone (the analytic profile's
// fallback: profile/analytic.h).
KeptFacts measure_node_facts(const OpGraph& graph, int node, const ProfilerOptions& options);

// Runs real training steps of the whole graph (one micro-batch each) and measures them; the
// first steps create the optimizer state and are not measured.
StepMeasurement measure_step(const OpGraph& graph, OptimizerKind optimizer, const ProfilerOptions& options,
                             int steps = 5);

}  // namespace dawnpiper
