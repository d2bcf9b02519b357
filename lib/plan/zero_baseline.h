#pragma once
// ZeRO's data-parallel baseline, the paper's Table 2 rows ZeRO-2 and ZeRO-3 (`plan --planner
// zero2|zero3`): what one of D GPUs holds when each trains the whole model on its own batch of b
// samples under DeepSpeed's ZeRO stage 1, 2 or 3 with DeepSpeed's default buckets, the largest
// b that fits a device, and a rough step time. Pure C++ over the profile (no LibTorch).
//
// One GPU's peak is the step's activation high-water mark plus flat state terms:
//   activations  the whole graph replayed as one stage training one micro-batch of b, nothing
//                evicted (plan/stage_memory.h, the replay the pipeline planners check stages
//                with), on the profile with its parameter state taken out: activations, the
//                gradients flowing through the backward, data, workspaces, constants and the
//                device runtime's bytes (Profile::runtime_bytes). (The replay still holds one
//                byte of weight, gradient and optimizer state per node that owns parameters.)
//   parameters   compute precision: every parameter at levels 0-2; at 3 the GPU's 1/D shard,
//                plus the parameters DeepSpeed never partitions (a node's parameters of at most
//                stage3_param_persistence_threshold elements, whole: layer norms, biases).
//   gathered     level 3: parameters gathered for use, the prefetch bucket
//                (stage3_prefetch_bucket_size elements) plus the largest node's parameters,
//                at most stage3_max_live_parameters elements and the parameters not held.
//   gradients    levels 0-1: all of them; 2-3: the GPU's 1/D partition, one flat buffer
//                (stage 2's grads_in_partition, stage 3's grad_partitions_flat_buffer).
//   master       levels 1-3: the fp32 master copy of the GPU's partition, 4 N / D bytes for N
//                parameters (DeepSpeed clones the partition to fp32 in fp32 runs too).
//   optimizer    its state on the fp32 masters (SGD's momentum 4 N, Adam's moments 8 N), / D.
//   buckets      contiguous_gradients (default on): levels 1-2 allocate a reduce bucket of
//                reduce_bucket_size elements at each backward (two with overlap_comm, whose
//                default is off below stage 3); level 3 one such buffer for the whole run.
//   transient    levels 1-3: the largest parameter's gradient as autograd makes it, before it
//                is copied into the bucket.
// The training peak is the sum of all these; at the optimizer step levels 1-2 also hold a flat
// fp32 copy of the gradient partition (4 N / D; level 3 in bf16 too) while the activations are
// gone. DeepSpeed's defaults, from deepspeed/runtime/zero/config.py (DeepSpeedZeroConfig):
// reduce_bucket_size = allgather_bucket_size = 5e8 elements, stage3_prefetch_bucket_size = 5e7,
// stage3_param_persistence_threshold = 1e5, stage3_max_live_parameters = 1e9,
// contiguous_gradients = true, overlap_comm = (stage == 3). The allgather bucket takes no memory
// of its own: stages 1-2 gather the updated partitions into the flat parameter buffer in place.
// Level 0 is plain data parallelism as DawnPiper's runtime runs it (gradients averaged tensor by
// tensor after the backward, no buckets): its peak is the one-stage replay's own, with every
// parameter, its gradient as the backward makes it and the optimizer state (`plan --stages 1`'s
// prediction); `activations` is that peak less the full state.
//
// Time (rough): the whole graph's forward and backward at b (the profile's node times) plus
// the collectives over the link, not overlapped: a ring moves (D - 1) / D of the bytes it
// reduces or gathers; levels 0-2 move the parameters' bytes twice a step (reduce-scatter or
// allreduce of the gradients, all-gather of the updated parameters), level 3 three times (its
// forward and its backward gather the parameters, its gradients are reduce-scattered).
#include <cstdint>
#include <iosfwd>
#include <string>

#include "plan/plan_options.h"
#include "profile/profile.h"
#include "train/optimizer_kind.h"

namespace dawnpiper {

// Whether `planner` is ZeRO's data-parallel baseline (zero2, zero3) rather than a pipeline
// planner, and its level.
bool is_zero_baseline(PlannerKind planner);
int zero_level(PlannerKind planner);  // 2 or 3; ConfigError for a pipeline planner

struct ZeroConfig {  // DeepSpeed's defaults (above)
  int64_t reduce_bucket_elements = 500000000;
  int64_t prefetch_bucket_elements = 50000000;
  int64_t param_persistence_threshold = 100000;
  int64_t max_live_parameters = 1000000000;
  bool contiguous_gradients = true;
  int overlap_comm = -1;  // 1 / 0; -1: DeepSpeed's default (on at level 3 only)
};

struct ZeroBaselineOptions {
  int level = 2;          // 0-3
  int data_parallel = 1;  // D: GPUs, each training the whole model on its own batch
  OptimizerKind optimizer = OptimizerKind::Sgd;
  int64_t capacity_bytes = kUnlimitedBytes;  // what the plan may fill per GPU (PlanOptions')
  double link_bandwidth = 10e9;              // bytes/s between GPUs
  ZeroConfig config;
};
// The level from options.planner (zero2 or zero3), the rest from the options as `plan` set
// them (data_parallel, optimizer, capacity after the allocator's headroom, link bandwidth).
ZeroBaselineOptions zero_baseline_options(const PlanSettings& options);

struct ZeroMemory {  // bytes one GPU holds (above)
  int64_t parameters = 0;
  int64_t gathered = 0;
  int64_t gradients = 0;
  int64_t master = 0;
  int64_t optimizer = 0;
  int64_t buckets = 0;
  int64_t transient = 0;
  int64_t activations = 0;
  int64_t step_extra = 0;
  int64_t state() const { return parameters + gradients + master + optimizer; }
  int64_t training_peak() const { return state() + gathered + buckets + transient + activations; }
  int64_t step_peak() const { return state() + step_extra; }
  int64_t peak() const { return training_peak() > step_peak() ? training_peak() : step_peak(); }
};

struct ZeroBaseline {
  int level = 2;
  int data_parallel = 1;
  int64_t micro_batch_size = 0;  // per GPU
  ZeroMemory memory;
  double compute_ms = 0;     // forward + backward of the whole graph at micro_batch_size
  double collective_ms = 0;  // the step's reductions and gathers over the link
  double update_ms = 0;      // the optimizer on the GPU's shard (Profile::update_ms; 0: not known)
  int64_t global_batch() const { return micro_batch_size * data_parallel; }
  double step_ms() const { return compute_ms + collective_ms + update_ms; }
  double samples_per_s() const { return step_ms() > 0 ? 1e3 * static_cast<double>(global_batch()) / step_ms() : 0; }
};

// One GPU of ZeRO at the profile's micro-batch size. ConfigError on a level outside 0-3 or
// D < 1.
ZeroBaseline zero_baseline(const Profile& profile, const ZeroBaselineOptions& options);
// The largest per-GPU micro-batch size b <= upper_bound whose peak fits options.capacity_bytes,
// evaluating the profile at each b through its batch-size fits (the peak only grows with b:
// doubling, then bisection). ConfigError when the profile has no batch-size fits;
// InfeasibleError when not even b = 1 fits (naming what it needs).
ZeroBaseline zero_max_batch(const Profile& profile, const ZeroBaselineOptions& options, int64_t upper_bound = 4096);

// "ZeRO-2 over 4 GPUs", "ZeRO-3 over 1 GPU".
std::string zero_text(int level, int data_parallel);
// What `plan` prints: the per-GPU breakdown against the capacity, the global batch, the step.
void print_zero_baseline(std::ostream& out, const ZeroBaseline& z, int64_t capacity_bytes);

}  // namespace dawnpiper
