#pragma once
// What a plan is asked for. Every choice is an enum, parsed once from its name (the command line,
// the plan file) and printed by name; the planner and the runtime compare enums, never strings.
#include <climits>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "profile/host_link.h"
#include "schedule/schedule.h"
#include "train/optimizer_kind.h"
#include "util/units.h"
#include "util/enum_names.h"

namespace dawnpiper {

// Zero2 and Zero3 are no pipeline planners: ZeRO's data-parallel baseline, which `plan` computes
// (plan/zero_baseline.h) and make_plan refuses.
enum class PlannerKind { DawnPiper, GPipe, PipeDream, VPipe, Even, Exact, Zero2, Zero3 };
template <>
struct EnumNames<PlannerKind> {
  static constexpr const char* what = "planner";
  static constexpr std::array<std::pair<PlannerKind, const char*>, 8> table{{{PlannerKind::DawnPiper, "dawnpiper"},
                                                                             {PlannerKind::GPipe, "gpipe"},
                                                                             {PlannerKind::PipeDream, "pipedream"},
                                                                             {PlannerKind::VPipe, "vpipe"},
                                                                             {PlannerKind::Even, "even"},
                                                                             {PlannerKind::Exact, "exact"},
                                                                             {PlannerKind::Zero2, "zero2"},
                                                                             {PlannerKind::Zero3, "zero3"}}};
};

enum class MemoptKind { None, Recompute, SwapRecompute };
template <>
struct EnumNames<MemoptKind> {
  static constexpr const char* what = "memopt";
  static constexpr std::array<std::pair<MemoptKind, const char*>, 3> table{
      {{MemoptKind::None, "none"}, {MemoptKind::Recompute, "r"}, {MemoptKind::SwapRecompute, "sr"}}};
  static constexpr std::array<const char*, 3> meaning{"", "recompute", "swap + recompute"};
};

// What a plan is asked for besides its schedule and its stages: shared by the request (PlanRequest,
// what the command line asks) and the options one search plans with (PlanOptions, what the plan
// records).
struct PlanSettings {
  int64_t micro_batches = 4;  // per mini-batch (per optimizer step for gpipe / 1f1b)
  OptimizerKind optimizer = OptimizerKind::Sgd;
  // Device memory per rank the plan may fill; under an interleaved schedule each of a rank's V
  // stages is planned within capacity / V, so that their sum fits.
  int64_t capacity_bytes = kUnlimitedBytes;
  // What the device memory held beyond capacity_bytes, left to the allocator's fragmentation (the
  // CUDA caching allocator reserves more than it allocates; a cap limits what it reserves).
  int64_t allocator_headroom_bytes = 0;
  double host_bandwidth = 16e9;  // bytes/s, device <-> host (swap), where the link is not measured
  // The host link the profile measured (CUDA), which a swap's copy time follows unless
  // host_bandwidth_given (--host-bandwidth) says to take that constant; the plan records the one
  // it used.
  HostLink host_link;
  bool host_bandwidth_given = false;
  double link_bandwidth = 10e9;  // bytes/s, stage <-> stage
  // Bytes/s between a stage's replicas, which their gradient collectives cross: what `train`
  // measured (runtime/replica_link.h) or --replica-bandwidth gave; 0: link_bandwidth.
  double replica_bandwidth = 0;
  // What a computing rank pays of its replicas' collectives: its passes take this many ms longer
  // per ms of the collectives beside them at replica_bandwidth (runtime/replica_link.h's drag:
  // `train` measures it on the CPU, where Open MPI moves them only inside the rank's own MPI
  // calls; --replica-drag gives it). 0: they run beside the compute (NCCL's own stream).
  double replica_drag = 0;
  PlannerKind planner = PlannerKind::DawnPiper;
  MemoptKind memopt = MemoptKind::None;
  // The search decides with the cost model's memory formula; the replay of each stage's action
  // list (plan/stage_memory) is what the runtime measures. When set (the command line does), a
  // plan whose replayed peak exceeds the capacity is searched again with the capacity lowered
  // by the overshoot. Unset, plans are the search's own (its tests check it against the formula).
  bool fit_replayed = false;
  // Pipelines training in parallel on their shares of the data: each stage averages its
  // gradients with its replicas (a ring allreduce over the replica link) before every update.
  int data_parallel = 1;
  // Sharded data parallelism within each stage's replicas (DeepSpeed's levels 0-3): at 1 a
  // replica holds the optimizer state of 1/D of the stage's parameters, at 2 of its gradients
  // too, at 3 of its parameters too; gradients and parameters travel in flat buckets of about
  // bucket_bytes. No effect with D = 1.
  int zero_stage = 0;
  int64_t bucket_bytes = int64_t{25} << 20;
  // The level that takes effect: zero_stage with replicas to shard over, else 0.
  int sharding() const { return data_parallel > 1 ? zero_stage : 0; }
  // The bytes/s the replicas' collectives take: replica_bandwidth where known, else the link's.
  double replica_link_bandwidth() const { return replica_bandwidth > 0 ? replica_bandwidth : link_bandwidth; }
};

// Why ZeRO level `level` cannot run under `schedule` (one line naming both), or "" where it can.
// Async (PipeDream's weight stashing) runs level 1 only.
std::string zero_refusal(int level, const ScheduleChoice& schedule);

// One search's inputs, as the plan records them: the schedule resolved.
struct PlanOptions : PlanSettings {
  int stages = 1;  // to cut: ranks x the schedule's virtual stages
  ScheduleChoice schedule;
};

// What a run asks of its plan, read once from the command line (cli/options.h: plan_request_from)
// by `plan` and `train` alike; the planner resolves it into a Plan (plan/schedule_search.h), and
// everything after reads the plan.
struct PlanRequest : PlanSettings {
  int ranks = 1;  // pipeline ranks; each holds schedule's virtual stages
  ScheduleRequest schedule;
  // The options of one search under `choice` (one of schedule.candidates()).
  PlanOptions options_for(const ScheduleChoice& choice) const {
    PlanOptions o;
    static_cast<PlanSettings&>(o) = *this;
    o.schedule = choice;
    o.stages = ranks * choice.virtual_stages();
    return o;
  }
};

// Splits `device_memory` (bytes per stage; kUnlimitedBytes: no limit) into what the plan may fill and
// `headroom_share` of it left to the allocator.
void set_device_memory(PlanSettings& options, int64_t device_memory, double headroom_share);

}  // namespace dawnpiper
