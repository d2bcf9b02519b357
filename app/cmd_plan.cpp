// dawnpiper plan: partition a profiled model into pipeline stages (and choose swap/recompute
// per tensor) without training: print the plan, write it as JSON, or find the largest
// micro-batch that fits.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "app/commands.h"
#include "app/plan_zero_baseline.h"
#include "cli/options.h"
#include "memory/counting_allocator.h"
#include "memory/device_memory.h"  // parse_device
#include "plan/calibrate.h"
#include "plan/planner.h"
#include "plan/schedule_search.h"
#include "plan/zero_baseline.h"
#include "profile/analytic.h"
#include "profile/profile_io.h"
#include "profile/profiler.h"
#include "runtime/stage_alone.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/units.h"

namespace dawnpiper {

namespace {

po::options_description plan_options() {
  po::options_description own("Plan options");
  // clang-format off
  own.add_options()
      ("profile-in", po::value<std::string>(), "profile to plan from (HDF5, `dawnpiper profile --out`)")
      ("device-spec", po::value<std::string>(), "without --profile-in: plan --model from an analytic profile "
                                                "for this device (a100-40gb | h100-80gb | spec file)")
      ("host-bandwidth", po::value<std::string>(), "device<->host bytes/s for swaps, e.g. 24GB")
      ("link-bandwidth", po::value<std::string>(), "stage<->stage bytes/s, e.g. 10GB")
      ("replica-bandwidth", po::value<std::string>(), "bytes/s between a stage's replicas for their gradient "
                                                      "collectives (default: --link-bandwidth; `train` measures it), "
                                                      "e.g. 2GB")
      ("replica-drag", po::value<double>(), "ms a computing rank's pass takes longer per ms of its replicas' "
                                            "collectives beside it (default 0: beside the compute, as NCCL; "
                                            "`train` measures it on the CPU)")
      ("max-batch", po::bool_switch(), "find the largest micro-batch size with a feasible plan")
      ("calibrate-rounds", po::value<int>()->default_value(0), "plan, run every stage alone here, scale its nodes' times by "
                                                               "measured / predicted and plan again, this many times; keep the "
                                                               "plan whose slowest stage measured fastest (needs the model "
                                                               "options the profile was made with)")
      ("calibrate-steps", po::value<int64_t>()->default_value(3), "steps per stage and round (the first a warm-up)")
      ("calibrate-trace", po::value<std::vector<std::string>>()->composing(),
       "scale each traced stage's node times to what the run measured (`train --trace` of a run planned from this "
       "profile; several: each node takes the mean of its factors)")
      ("out", po::value<std::string>(), "write the plan as JSON");
  // clang-format on
  po::options_description options;
  options.add(own)
      .add(planning_options())
      .add(run_options())
      .add(allocator_headroom_option())
      .add(model_override_options());
  return options;
}

// --stages and --data-parallel as `train` takes them where not given: the MPI ranks (of `mpirun
// -np N dawnpiper plan`) placed by the other; one process has no ranks to count, and one replica.
void place_ranks(PlanRequest& r, int world_size) {
  if (r.ranks == 0 && is_zero_baseline(r.planner)) r.ranks = 1;  // ZeRO: one stage
  if (r.data_parallel == 0) r.data_parallel = r.ranks > 0 && world_size % r.ranks == 0 ? world_size / r.ranks : 1;
  if (r.ranks > 0) return;
  if (world_size == 1)
    throw ConfigError("give --stages L: `plan` runs in one process, with no MPI ranks to count (train's default)");
  if (world_size % r.data_parallel != 0)
    throw ConfigError("--data-parallel " + std::to_string(r.data_parallel) + " does not divide the " +
                      std::to_string(world_size) + " MPI ranks: give --stages");
  r.ranks = world_size / r.data_parallel;
}

// The profile to plan from (a file, or the model's analytic profile for a device spec) and the
// request's memory and links: a device spec's unless flags override them.
Profile profile_and_request(const po::variables_map& vm, int world_size, PlanRequest& o) {
  place_ranks(o, world_size);
  if (o.zero_stage > 0 && o.data_parallel == 1 && !vm["quiet"].as<bool>())
    std::printf(
        "note: --zero-stage %d shards over each stage's replicas, and --data-parallel is 1: it changes "
        "nothing\n",
        o.zero_stage);
  const int64_t B = vm["micro-batch-size"].as<int64_t>();
  if (B < 1) throw ConfigError("micro-batch size must be at least 1");
  Profile profile;
  if (vm.count("profile-in")) {
    if (vm.count("device-spec"))
      throw ConfigError("--profile-in and --device-spec both give the profile to plan from: give one");
    profile = read_profile(vm["profile-in"].as<std::string>());
    if (vm.count("precision") && vm["precision"].as<Precision>() != profile.precision)
      throw ConfigError("--profile-in was profiled in " + std::string(name_of(profile.precision)) + ", not " +
                        name_of(vm["precision"].as<Precision>()));
    if (!vm["micro-batch-size"].defaulted() && B != profile.micro_batch_size) profile = profile.at_batch(B);
  } else if (vm.count("device-spec")) {
    const DeviceSpec spec = device_spec(vm["device-spec"].as<std::string>());
    ProfilerOptions measured;
    measured.seed = vm["seed"].as<uint64_t>();
    profile = analytic_profile_model(model_source_from(vm), {B, 2 * B}, spec,
                                     [&](const OpGraph& g, int node) { return measure_node_facts(g, node, measured); });
    if (!profile.notes.empty()) std::printf("note: %s\n", profile.notes.c_str());
    o.capacity_bytes = spec.memory_bytes;
    o.host_bandwidth = spec.host_bandwidth;
    o.link_bandwidth = spec.link_bandwidth;
  } else {
    throw ConfigError("give --profile-in FILE (a profile) or --device-spec NAME (plan --model analytically)");
  }
  if (vm.count("device-memory"))
    o.capacity_bytes = parse_capacity(vm["device-memory"].as<std::string>(), "--device-memory");
  if (vm.count("allocator-headroom") && o.capacity_bytes == kUnlimitedBytes)
    throw ConfigError("--allocator-headroom is a share of the device memory: give --device-memory too");
  set_device_memory(o, o.capacity_bytes,
                    vm.count("allocator-headroom")
                        ? parse_allocator_headroom(vm["allocator-headroom"].as<std::string>())
                        : default_allocator_headroom(profile.source == ProfileSource::Measured ? profile.device : ""));
  if (vm.count("host-bandwidth")) {  // a constant, instead of the link the profile measured
    o.host_bandwidth = static_cast<double>(parse_bytes(vm["host-bandwidth"].as<std::string>(), "--host-bandwidth"));
    o.host_bandwidth_given = true;
  }
  if (vm.count("link-bandwidth"))
    o.link_bandwidth = static_cast<double>(parse_bytes(vm["link-bandwidth"].as<std::string>(), "--link-bandwidth"));
  o.replica_bandwidth = replica_bandwidth_option(vm);
  o.replica_drag = std::max(0.0, replica_drag_option(vm));
  return profile;
}

// A plan from --profile-in alone builds no model: what selects one is refused, not ignored.
void refuse_model_options(const po::variables_map& vm) {
  std::vector<std::string> names = {"model", "model-file", "init-from", "seed", "device"};
  const po::options_description overrides = model_override_options();
  for (const auto& opt : overrides.options()) names.push_back(opt->long_name());
  for (const std::string& name : names)
    if (vm.count(name) && !vm[name].defaulted())
      throw ConfigError("--" + name +
                        " selects the model that --calibrate-rounds runs; --profile-in alone plans from " +
                        "the profile's graph");
}

// Plans from the profile, then corrects it by running every stage alone (plan/calibrate.h).
Plan calibrated(const po::variables_map& vm, const Profile& profile, const PlanRequest& request, int rounds) {
  const int64_t steps = vm["calibrate-steps"].as<int64_t>();
  if (steps < 1) throw ConfigError("--calibrate-steps must be at least 1");
  const OpGraph graph = model_source_from(vm).graph(profile.micro_batch_size);
  if (graph.size() != profile.size() || (!profile.graph_hash.empty() && graph.fingerprint() != profile.graph_hash))
    throw ConfigError("--calibrate-rounds runs the model, and " + graph.preset +
                      " with these options is not the graph the profile was made for (give the model options the "
                      "profile was made with)");
  CountingAllocator::install();
  const c10::Device device = parse_device(vm["device"].as<DeviceKind>());
  const PlanOptions o = resolve_plan(profile, request).options;  // --schedule auto's choice, calibrated
  const CalibratedPlan c =
      calibrate_plan(profile, o, rounds, stage_alone_timer(graph, device, steps, vm["seed"].as<uint64_t>()));
  for (size_t r = 0; r < c.rounds.size() && !vm["quiet"].as<bool>(); ++r) {
    const CalibrationRound& round = c.rounds[r];
    std::printf("calibration round %zu: cuts", r);
    for (int cut : round.cuts) std::printf(" %d", cut);
    std::printf(", ms per stage predicted");
    for (double ms : round.predicted) std::printf(" %.1f", ms);
    std::printf(", measured");
    for (double ms : round.measured) std::printf(" %.1f", ms);
    std::printf(" (slowest %.1f, spread %.1f%%)%s\n", round.measured_bottleneck(), 100 * round.measured_spread(),
                static_cast<int>(r) == c.chosen ? ", kept" : "");
  }
  return c.plan;
}

}  // namespace

int cmd_plan(int argc, char** argv, const MpiWorld& world) {
  po::variables_map vm;
  if (!parse_options(argc, argv, "plan", "Plans pipeline stages and per-tensor memory optimization from a profile.",
                     plan_options(), vm))
    return 0;
  if (world.rank != 0) return 0;
  const bool zero = is_zero_baseline(vm["planner"].as<PlannerKind>());
  if (zero) refuse_for_zero_baseline(vm);
  if (vm.count("out")) check_writable(vm["out"].as<std::string>());
  PlanRequest o = plan_request_from(vm);
  Profile profile = profile_and_request(vm, world.size, o);
  if (zero) return plan_zero_baseline(vm, profile, o);
  if (vm.count("calibrate-trace")) {
    if (!vm.count("profile-in"))  // an analytic profile is another device's times
      throw ConfigError("--calibrate-trace needs --profile-in (the profile the traced run was planned from)");
    calibrate_from_traces(profile, vm["calibrate-trace"].as<std::vector<std::string>>());
  }
  Plan plan;
  const int calibrate = vm["calibrate-rounds"].as<int>();
  if (calibrate < 0) throw ConfigError("--calibrate-rounds must be at least 0");
  if (calibrate > 0 && vm["max-batch"].as<bool>())
    throw ConfigError("--calibrate-rounds plans one micro-batch size, not --max-batch");
  if (calibrate > 0 && !vm.count("profile-in"))  // an analytic profile is another device's times
    throw ConfigError("--calibrate-rounds needs --profile-in (a profile measured on the device it runs the stages on)");
  if (calibrate == 0 && !vm["calibrate-steps"].defaulted())
    throw ConfigError("--calibrate-steps applies with --calibrate-rounds");
  if (calibrate == 0 && vm.count("profile-in")) refuse_model_options(vm);
  if (calibrate > 0) {
    plan = calibrated(vm, profile, o, calibrate);
  } else if (vm["max-batch"].as<bool>()) {
    MaxBatch best = find_max_batch(profile, o);
    std::printf("largest micro-batch size: %lld\n", static_cast<long long>(best.micro_batch_size));
    plan = best.plan;
  } else {
    plan = resolve_plan(profile, o, vm["quiet"].as<bool>() ? nullptr : &std::cout);
  }
  if (!vm["quiet"].as<bool>()) plan.print_table(std::cout);
  if (vm.count("out")) {
    write_text_atomically(vm["out"].as<std::string>(), plan.to_json());
    std::printf("wrote %s\n", vm["out"].as<std::string>().c_str());
  }
  return 0;
}

}  // namespace dawnpiper
