#include "run/agreed_plan.h"

#include <ATen/Parallel.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "memory/device_memory.h"
#include "plan/calibrate.h"
#include "plan/planner.h"
#include "plan/schedule_search.h"
#include "profile/profile_cache.h"
#include "profile/profile_io.h"
#include "profile/profiler.h"
#include "run/resume.h"
#include "runtime/checkpoint.h"
#include "runtime/mpi_wait.h"
#include "runtime/replica_link.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/files.h"
#include "util/units.h"

namespace dawnpiper {

namespace {

// The profile train plans from: measured here, or the one measured before under the same key
// (profile/profile_cache.h), so that runs of one setup plan from the same numbers.
Profile measured_profile(const TrainOptions& o, const OpGraph& graph, c10::Device device) {
  ProfilerOptions options;
  options.warmup = 1;
  options.iterations = 3;
  options.seed = o.config.seed;
  options.device = device;
  const std::string dir = profile_cache_dir(o.profile_cache);
  const std::string settings = device.str() + " threads " + std::to_string(at::get_num_threads()) + " warmup " +
                               std::to_string(options.warmup) + " iterations " + std::to_string(options.iterations) +
                               " seed " + std::to_string(options.seed);
  const std::string path = dir.empty() ? "" : profile_cache_path(dir, graph, settings);
  if (!path.empty())
    if (std::optional<Profile> cached = read_cached_profile(path, graph)) {
      if (!o.quiet) std::printf("profile: %s (cached; --profile-cache off measures afresh)\n", path.c_str());
      return std::move(*cached);
    }
  Profile profile = profile_graph(graph, options);
  if (!path.empty()) {
    const bool kept = write_cached_profile(path, profile);
    if (!o.quiet) std::printf("profile: measured, %s %s\n", kept ? "kept in" : "could not keep it in", path.c_str());
  }
  return profile;
}

// Rank 0: a plan made from a loaded or freshly measured profile, as JSON; `replica_bandwidth`
// and `replica_drag`: the link between a stage's replicas (bandwidth 0: the link bandwidth).
std::string plan_on_rank0(const TrainOptions& o, const OpGraph& graph, const RankLayout& layout, c10::Device device,
                          double replica_bandwidth, double replica_drag) {
  Profile profile;
  if (!o.profile_in.empty()) {
    profile = read_profile(o.profile_in);
    if (const std::string why = profile.device_mismatch(device.str()); !why.empty())
      throw ConfigError("--profile-in: " + why);
    if (profile.precision != graph.precision)
      throw ConfigError("--profile-in was profiled in " + std::string(name_of(profile.precision)) +
                        ", this run trains in " + name_of(graph.precision) + " (profile again with --precision " +
                        name_of(graph.precision) + ")");
    if (profile.preset != graph.preset || profile.size() != graph.size())
      throw ConfigError("--profile-in is a profile of " + profile.preset + " (" + std::to_string(profile.size()) +
                        " nodes), not of this " + graph.preset + " graph (" + std::to_string(graph.size()) + " nodes)");
    // At the profiled size its measured times; at another, its batch-size fits (as `plan`).
    if (profile.micro_batch_size != graph.micro_batch_size) profile = profile.at_batch(graph.micro_batch_size);
  } else {
    profile = measured_profile(o, graph, device);
  }
  if (!o.calibrate_traces.empty()) {
    calibrate_from_traces(profile, o.calibrate_traces);
    if (!o.quiet)
      std::printf("profile: node times scaled to what %zu traced run(s) measured\n", o.calibrate_traces.size());
  }
  PlanRequest request = o.plan;
  request.ranks = layout.stages;
  request.data_parallel = layout.replicas;
  request.replica_bandwidth = replica_bandwidth;
  request.replica_drag = replica_drag;
  set_device_memory(request, o.capacity,
                    o.allocator_headroom >= 0 ? o.allocator_headroom : default_allocator_headroom(device.str()));
  return resolve_plan(profile, request, o.quiet ? nullptr : &std::cout).to_json();
}

}  // namespace

// What a resumed run asks of its plan that the checkpoint's plan (`saved`) was not made for, as
// "--option old -> new" items; "" where the saved plan serves. Options the command line leaves
// out have the saved plan's values (adopt_plan_settings); --device-memory counts where given,
// --calibrate-trace always (it corrects the profile a plan is made from), and whatever the
// memory, a plan predicted to peak above it does not serve.
std::string resumed_plan_changes(const Plan& saved, const OpGraph& graph, const TrainOptions& o,
                                 const RankLayout& layout, c10::Device device) {
  std::string changes;
  auto compare = [&](const std::string& key, const std::string& was, const std::string& now) {
    if (was != now) changes += (changes.empty() ? "--" : ", --") + key + " " + was + " -> " + now;
  };
  // The sample (--seq-len, --image-size) and the precision: the profile's sizes and times.
  if (const std::optional<Json> run = saved_run(o); run && run->contains("sample"))
    if (const std::string was = (*run)["sample"].get<std::string>(), now = sample_shape(graph); was != now)
      changes = "the sample " + was + " -> " + now;
  PlannedRun asked{o.plan, o.micro_batch_size, graph.precision};
  asked.request.ranks = layout.stages;
  asked.request.data_parallel = layout.replicas;
  asked.request.micro_batches = o.config.micro_batches;  // what the trainer steps with
  asked.request.optimizer = o.config.optimizer.kind;
  const PlannedRun was = planned_run(saved);
  for (const PlannedOption& option : planned_options())
    if (const std::string before = option.compared(was), after = option.compared(asked);
        !before.empty() && !after.empty())
      compare(option.key, before, after);
  const PlanOptions& p = saved.options;
  PlanOptions now;
  set_device_memory(now, o.capacity,
                    o.allocator_headroom >= 0 ? o.allocator_headroom : default_allocator_headroom(device.str()));
  const auto memory = [](const PlanOptions& m) {  // what --device-memory gave
    return m.capacity_bytes == kUnlimitedBytes
               ? std::string("unlimited")
               : format_bytes(static_cast<double>(m.capacity_bytes + m.allocator_headroom_bytes));
  };
  const bool memory_given = o.capacity != kUnlimitedBytes && o.capacity_source == "--device-memory";
  if (memory_given && now.capacity_bytes != p.capacity_bytes) {
    if (memory(p) != memory(now))
      compare("device-memory", memory(p), memory(now));
    else  // the same memory, another share left to the allocator
      compare("allocator-headroom", format_bytes(static_cast<double>(p.allocator_headroom_bytes)),
              format_bytes(static_cast<double>(now.allocator_headroom_bytes)));
  }
  if (!o.calibrate_traces.empty())  // a plan from node times the traces correct
    changes += std::string(changes.empty() ? "" : ", ") + "--calibrate-trace";
  if (changes.empty() && now.capacity_bytes != kUnlimitedBytes)
    for (const int64_t peak : saved.rank_peak_bytes(true))
      if (peak > now.capacity_bytes) {
        changes = "its predicted peak " + format_bytes(static_cast<double>(peak)) + " is above the " +
                  format_bytes(static_cast<double>(now.capacity_bytes)) + " a rank may fill now (" + o.capacity_source +
                  ")";
        break;
      }
  return changes;
}

std::optional<GivenPlan> read_given_plan(const std::string& path, int rank) {
  if (path.empty()) return std::nullopt;
  GivenPlan given;
  if (rank == 0) given.json = read_text_file(path);
  broadcast_string_quietly(given.json, 0, MPI_COMM_WORLD);
  given.plan = plan_from_json(given.json);
  return given;
}

std::optional<GivenPlan> read_checkpoint_plan(const std::string& dir, int rank) {
  const std::string path = dir + "/plan.json";
  std::string found = rank == 0 && std::ifstream(path).good() ? "yes" : "";
  broadcast_string_quietly(found, 0, MPI_COMM_WORLD);
  if (found.empty()) return std::nullopt;
  return read_given_plan(path, rank);
}

Plan agreed_plan(const std::optional<GivenPlan>& given, const OpGraph& graph, const RankLayout& layout,
                 const TrainOptions& o, c10::Device device, int rank) {
  const std::string saved_plan = o.checkpoint_dir.empty() ? "" : o.checkpoint_dir + "/plan.json";
  std::string plan_json;
  if (given) {
    plan_json = given->json;
  } else {
    // The link the replicas' gradient collectives cross, measured by every rank at once where
    // the run has replicas and --replica-bandwidth does not say (and with it the drag, where
    // --replica-drag does not say).
    double replica_bandwidth = o.plan.replica_bandwidth, replica_drag = o.plan.replica_drag;
    if (layout.replicas > 1 && !(replica_bandwidth > 0)) {
      const ReplicaLink link =
          measure_replica_link(MPI_COMM_WORLD, layout.stage, layout.replicas, o.plan.bucket_bytes, device);
      replica_bandwidth = link.bandwidth;
      if (!o.replica_drag_given && link.drag >= 0) replica_drag = link.drag;
      if (rank == 0 && !o.quiet) std::printf("replica link: %s\n", link.summary().c_str());
    }
    // A resumed run keeps the plan its checkpoint was written with where it asks for nothing
    // else and its memory still holds; otherwise it plans anew, and each stage reads its tensors
    // by name.
    if (rank == 0) {
      bool keep_saved = o.resume && std::ifstream(saved_plan).good();
      if (keep_saved) {
        const Plan saved = plan_from_json(read_text_file(saved_plan));
        const std::string changes = resumed_plan_changes(saved, graph, o, layout, device);
        keep_saved = changes.empty();
        const int64_t step = o.resume_step >= 0 ? o.resume_step : checked_resume_step(o.checkpoint_dir, -1);
        if (!keep_saved && saved.options.sharding() > 0 && !checkpoint_moves(o.checkpoint_dir, step))
          throw ConfigError("the checkpoint in " + o.checkpoint_dir + " is sharded (--zero-stage " +
                            std::to_string(saved.options.sharding()) +
                            ") and was written before checkpoints had an index: it resumes only on the plan it was "
                            "written with, and this run changes " +
                            changes + ": repeat the checkpoint's values");
        if (!keep_saved && !o.quiet)
          std::printf(
              "note: the checkpoint's plan (%s) does not serve this run (%s): planning anew; each stage reads its "
              "parameters and optimizer state by name\n",
              saved_plan.c_str(), changes.c_str());
      }
      plan_json = keep_saved ? read_text_file(saved_plan)
                             : plan_on_rank0(o, graph, layout, device, replica_bandwidth, replica_drag);
    }
    broadcast_string_quietly(plan_json, 0, MPI_COMM_WORLD);  // the others wait while rank 0 plans
  }
  if (rank == 0 && !o.checkpoint_dir.empty() && !o.eval_only) {  // what a resumed run needs besides the weights
    make_directories(o.checkpoint_dir);
    write_text_atomically(saved_plan, plan_json);
    write_text_atomically(o.checkpoint_dir + "/run.json", run_identity(graph, o, true).dump(2) + "\n");
    // A Hugging Face model's config.json, for export-weights.
    if (!o.hf_config.empty()) write_text_atomically(o.checkpoint_dir + "/hf_config.json", o.hf_config);
  }
  Plan plan = plan_from_json(plan_json);
  if (plan.precision != graph.precision)
    throw ConfigError("the plan was made for " + std::string(name_of(plan.precision)) + ", this run trains in " +
                      name_of(graph.precision) + " (plan again from a " + name_of(graph.precision) + " profile)");
  const int virtual_stages = plan.options.schedule.virtual_stages();
  if (static_cast<int>(plan.stages.size()) != layout.stages * virtual_stages)
    throw ConfigError("the plan has " + std::to_string(plan.stages.size()) + " stages" +
                      (virtual_stages > 1 ? " (" + std::to_string(virtual_stages) + " per rank)" : "") + ", but " +
                      std::to_string(layout.stages) + (virtual_stages > 1 ? " ranks" : "") + " are launched");
  if (rank == 0 && !o.plan_out.empty()) write_text_atomically(o.plan_out, plan_json);
  return plan;
}

PipelineConfig pipeline_config(const Plan& plan, const OpGraph& graph, const RankLayout& layout, const TrainOptions& o,
                               c10::Device device, int64_t first_step) {
  PipelineConfig pc = pipeline_config_of(plan, graph);  // the plan's schedule, stages, micro-batching
  pc.steps = o.config.steps;
  pc.seed = o.config.seed;
  pc.optimizer = o.config.optimizer;
  pc.device = device;
  pc.data = o.config.data;
  pc.replica = layout.replica;
  pc.replicas = layout.replicas;
  pc.first_step = first_step;
  pc.zero_stage = layout.replicas > 1 ? o.plan.zero_stage : 0;
  pc.bucket_bytes = o.plan.bucket_bytes;
  if (const std::string refusal = zero_refusal(pc.zero_stage, pc.schedule); !refusal.empty())
    throw ConfigError(refusal);  // a plan file written by hand
  // A pipeline that does not drain every step drains where it writes a checkpoint and where it
  // evaluates (PipelineConfig::drain_every).
  if (!pc.schedule.traits().drains_every_step) {
    pc.drain_every = o.checkpoint_every;
    if (o.eval_every > 0 && pc.drain_every == 0) pc.drain_every = o.eval_every;
    if (o.eval_every > 0 && o.eval_every % pc.drain_every != 0)
      throw ConfigError("under --schedule " + std::string(name_of(pc.schedule)) +
                        ", --eval-every must be a multiple of --checkpoint-every (the pipeline drains there)");
  }
  return pc;
}

}  // namespace dawnpiper
