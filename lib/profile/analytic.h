#pragma once
// Analytic profiles for hardware we do not have: bytes exactly from shapes (what autograd saves
// per op kind, the same facts the measured profiler reads off autograd), times from a roofline
// estimate per op (FLOPs / peak, bytes / bandwidth, plus a per-kernel overhead). Pure C++.
#include <cstdint>
#include <string>
#include <vector>

#include "graph/op_graph.h"
#include "models/model_source.h"
#include "profile/profile.h"
#include "profile/profile_builder.h"

namespace dawnpiper {

struct DeviceSpec {
  std::string name;
  int64_t memory_bytes = 0;         // device memory capacity
  double flops = 0;                 // achievable FP32 FLOP/s for matmul and conv
  double bandwidth = 0;             // achievable device-memory bytes/s
  double host_bandwidth = 0;        // device <-> host bytes/s (swap)
  double link_bandwidth = 0;        // device <-> device bytes/s (pipeline activations)
  double kernel_overhead_s = 5e-6;  // per kernel launch
};

// "a100-40gb", "h100-80gb", or a spec file of `key = value` lines (name, memory, flops,
// bandwidth, host_bandwidth, link_bandwidth, kernel_overhead_us). ConfigError otherwise.
DeviceSpec device_spec(const std::string& name_or_file);

// Imported graphs: common ATen operators have formulas (matmuls, linear, attention, norms,
// softmax, elementwise, views, losses); for any other operator whose outputs need gradients,
// `measure` (the measured profiler on this machine) says what autograd keeps, and its time is
// memory-bound. Without `measure` every floating-point input is assumed kept. Profile::notes
// names those operators.
Profile analytic_profile(const OpGraph& graph, const DeviceSpec& spec, const MeasureNode& measure = {});
// One update of `parameters` fp32 masters per optimizer, bound by the device's memory bandwidth.
UpdateTimes roofline_update_times(int64_t parameters, const DeviceSpec& spec);
// Model FLOPs of one micro-batch's forward and backward (the formulas above; no recomputation,
// no optimizer): what a run's model FLOP/s and MFU count.
double model_flops_per_micro_batch(const OpGraph& graph);
// At each batch size, with exact linear fits (bytes) and fitted times; result at sizes.front().
Profile analytic_profile_model(const ModelSource& model, const std::vector<int64_t>& batch_sizes,
                               const DeviceSpec& spec, const MeasureNode& measure = {});

}  // namespace dawnpiper
