#include "plan/zero_baseline.h"

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>

#include "plan/stage_memory.h"
#include "util/error.h"
#include "util/units.h"

namespace dawnpiper {

bool is_zero_baseline(PlannerKind planner) { return planner == PlannerKind::Zero2 || planner == PlannerKind::Zero3; }

int zero_level(PlannerKind planner) {
  if (planner == PlannerKind::Zero2) return 2;
  if (planner == PlannerKind::Zero3) return 3;
  throw ConfigError(std::string("planner ") + name_of(planner) + " is a pipeline planner, not ZeRO's baseline");
}

ZeroBaselineOptions zero_baseline_options(const PlanSettings& options) {
  ZeroBaselineOptions z;
  z.level = zero_level(options.planner);
  z.data_parallel = options.data_parallel;
  z.optimizer = options.optimizer;
  z.capacity_bytes = options.capacity_bytes;
  z.link_bandwidth = options.link_bandwidth;
  return z;
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The profile without its parameter state: every node that owns (or reads a tied) parameter
// keeps one byte of it, so that the replay still sees which nodes read parameters (gradients
// flow and tensors carry them as before) while weights, gradients and optimizer state hold
// next to nothing.
Profile without_parameter_state(const Profile& profile) {
  Profile p = profile;
  for (NodeProfile& n : p.nodes) {
    n.param_bytes = std::min<int64_t>(n.param_bytes, 1);
    n.param_grad_bytes = std::min<int64_t>(n.param_grad_bytes, 1);
    n.tied_bytes = std::min<int64_t>(n.tied_bytes, 1);
  }
  p.largest_param_bytes = std::min<int64_t>(p.largest_param_bytes, 1);
  return p;
}

void check(const ZeroBaselineOptions& o) {
  if (o.level < 0 || o.level > 3)
    throw ConfigError("ZeRO level " + std::to_string(o.level) + " is none of 0, 1, 2, 3 (DeepSpeed's)");
  if (o.data_parallel < 1) throw ConfigError("ZeRO needs at least one GPU (data parallelism D >= 1)");
  if (o.link_bandwidth <= 0) throw ConfigError("the link bandwidth must be positive");
  const ZeroConfig& c = o.config;
  if (c.reduce_bucket_elements < 0 || c.prefetch_bucket_elements < 0 || c.param_persistence_threshold < 0 ||
      c.max_live_parameters < 0)
    throw ConfigError("ZeRO's bucket sizes and thresholds must not be negative");
}

ZeroMemory memory_of(const Profile& profile, const ZeroBaselineOptions& o) {
  const int64_t D = o.data_parallel;
  const int64_t element = profile.precision == Precision::Bf16 ? 2 : 4;  // compute precision
  int64_t weights = 0, persistent = 0, largest_node = 0;
  for (const NodeProfile& n : profile.nodes) {
    weights += n.param_bytes;
    largest_node = std::max(largest_node, n.param_bytes);
    if (n.param_bytes > 0 && n.param_bytes / element <= o.config.param_persistence_threshold)
      persistent += n.param_bytes;
  }
  // The largest single parameter tensor where the profile measured it, else the largest
  // node's parameters (a bound: a node may own a weight and a bias).
  const int64_t largest_tensor = profile.largest_param_bytes > 0 ? profile.largest_param_bytes : largest_node;
  const int64_t elements = ceil_div(weights, element);
  const int64_t shard_elements = ceil_div(elements, D);
  const int64_t fp32_shard = 4 * shard_elements;
  const int multiplier = optimizer_state_multiplier(o.optimizer);

  ZeroMemory m;
  if (o.level == 0) {  // the one-stage replay itself, its gradients appearing as the backward makes them
    m.parameters = weights;
    m.gradients = weights;
    m.optimizer = multiplier * weights;
    m.activations = std::max<int64_t>(0, replay_whole_step(profile, o.optimizer).peak - m.state());
    return m;
  }
  m.activations = replay_whole_step(without_parameter_state(profile), o.optimizer).peak;
  if (o.level == 3) {
    const int64_t partitioned = weights - persistent;
    m.parameters = ceil_div(partitioned, D) + persistent;
    const int64_t in_flight =
        std::min(o.config.max_live_parameters, o.config.prefetch_bucket_elements + ceil_div(largest_node, element)) *
        element;
    m.gathered = std::max<int64_t>(0, std::min(in_flight, weights - m.parameters));
  } else {
    m.parameters = weights;
  }
  m.gradients = o.level >= 2 ? shard_elements * element : weights;
  m.master = fp32_shard;
  m.optimizer = multiplier * fp32_shard;
  const int overlap = o.config.overlap_comm >= 0 ? o.config.overlap_comm : (o.level == 3 ? 1 : 0);
  if (o.config.contiguous_gradients)
    m.buckets = o.config.reduce_bucket_elements * element * (o.level < 3 && overlap ? 2 : 1);
  m.transient = largest_tensor;
  // Stages 1-2 flatten the partition's gradients into a new fp32 tensor for the optimizer;
  // stage 3 converts its flat partition, a copy only from bf16.
  m.step_extra = o.level < 3 || profile.precision == Precision::Bf16 ? fp32_shard : 0;
  if (o.level == 3) m.step_extra += m.buckets;  // its bucket lives through the step
  return m;
}

}  // namespace

ZeroBaseline zero_baseline(const Profile& profile, const ZeroBaselineOptions& options) {
  check(options);
  ZeroBaseline z;
  z.level = options.level;
  z.data_parallel = options.data_parallel;
  z.micro_batch_size = profile.micro_batch_size;
  z.memory = memory_of(profile, options);
  for (const NodeProfile& n : profile.nodes) z.compute_ms += n.fwd_ms + n.bwd_ms;
  int64_t weights = 0;
  for (const NodeProfile& n : profile.nodes) weights += n.param_bytes;
  const double D = options.data_parallel;
  const double passes = options.level == 3 ? 3 : 2;
  z.collective_ms = 1e3 * passes * (D - 1) / D * static_cast<double>(weights) / options.link_bandwidth;
  z.update_ms = profile.update_ms.of(options.optimizer) / (options.level > 0 ? D : 1);
  return z;
}

ZeroBaseline zero_max_batch(const Profile& profile, const ZeroBaselineOptions& options, int64_t upper_bound) {
  check(options);
  if (upper_bound < 1) throw ConfigError("the micro-batch size bound must be at least 1");
  bool fits_given = false;
  for (const TensorProfile& t : profile.tensors) fits_given = fits_given || t.bytes_fit.per_sample != 0;
  if (!fits_given)
    throw ConfigError(
        "the profile has no batch-size fits; profile it at two or more batch sizes to search the "
        "micro-batch size");
  auto at = [&](int64_t b) { return zero_baseline(profile.at_batch(b), options); };
  auto fits = [&](const ZeroBaseline& z) { return z.memory.peak() <= options.capacity_bytes; };
  ZeroBaseline best = at(1);
  if (!fits(best))
    throw InfeasibleError(zero_text(options.level, options.data_parallel) + " needs " +
                          format_bytes(static_cast<double>(best.memory.peak())) +
                          " per GPU at micro-batch size 1, above the " +
                          format_bytes(static_cast<double>(options.capacity_bytes)) + " it may fill");
  // Doubling until a size fails, then bisection between the last that fits and it.
  int64_t lo = 1, hi = 0;
  while (hi == 0) {
    const int64_t next = std::min(upper_bound, 2 * lo);
    if (next == lo) return best;
    ZeroBaseline z = at(next);
    if (!fits(z)) {
      hi = next;
      break;
    }
    lo = next, best = std::move(z);
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    ZeroBaseline z = at(mid);
    if (fits(z))
      lo = mid, best = std::move(z);
    else
      hi = mid;
  }
  return best;
}

std::string zero_text(int level, int data_parallel) {
  return "ZeRO-" + std::to_string(level) + " over " + std::to_string(data_parallel) +
         (data_parallel == 1 ? " GPU" : " GPUs");
}

void print_zero_baseline(std::ostream& out, const ZeroBaseline& z, int64_t capacity_bytes) {
  auto gib = [](int64_t bytes) { return static_cast<double>(bytes) / double(int64_t{1} << 30); };
  const ZeroMemory& m = z.memory;
  char line[512];
  std::snprintf(line, sizeof line, ", data parallel: micro-batch %lld per GPU, global batch %lld\n",
                static_cast<long long>(z.micro_batch_size), static_cast<long long>(z.global_batch()));
  out << zero_text(z.level, z.data_parallel) << line;
  std::snprintf(line, sizeof line,
                "per GPU (GiB): parameters %.2f, gathered %.2f, gradients %.2f, fp32 master %.2f, optimizer %.2f, "
                "buckets %.2f, transient %.2f, activations %.2f; peak %.2f",
                gib(m.parameters), gib(m.gathered), gib(m.gradients), gib(m.master), gib(m.optimizer), gib(m.buckets),
                gib(m.transient), gib(m.activations), gib(m.peak()));
  out << line;
  if (capacity_bytes != kUnlimitedBytes) {
    std::snprintf(line, sizeof line, " of %.2f", gib(capacity_bytes));
    out << line;
  }
  out << (m.step_peak() > m.training_peak() ? " (at the optimizer step)\n" : "\n");
  std::snprintf(
      line, sizeof line,
      "predicted step: compute %.1f ms + collectives %.1f ms (not overlapped) + update %.1f ms = %.1f ms, %.1f "
      "samples/s\n",
      z.compute_ms, z.collective_ms, z.update_ms, z.step_ms(), z.samples_per_s());
  out << line;
}

}  // namespace dawnpiper
