#include "app/plan_zero_baseline.h"

#include <cstdio>
#include <iostream>
#include <string>

#include "plan/zero_baseline.h"
#include "util/error.h"
#include "util/units.h"

namespace dawnpiper {

void refuse_for_zero_baseline(const po::variables_map& vm) {
  const std::string planner = std::string("--planner ") + name_of(vm["planner"].as<PlannerKind>());
  auto given = [&](const char* name) { return vm.count(name) && !vm[name].defaulted(); };
  if (given("stages") && vm["stages"].as<int>() != 1)
    throw ConfigError(planner + " is pure data parallelism: the whole model (one stage) on each of --data-parallel D " +
                      "GPUs; give --stages 1 or leave it out, not " + std::to_string(vm["stages"].as<int>()));
  if (given("virtual-stages") && vm["virtual-stages"].as<int>() != 1)
    throw ConfigError(planner + " runs one stage per GPU: leave --virtual-stages out");
  if (given("micro-batches") && vm["micro-batches"].as<int64_t>() != 1)
    throw ConfigError(planner + " trains one micro-batch per GPU and step (its global batch is D x " +
                      "--micro-batch-size): leave --micro-batches out");
  if (vm["memopt"].as<MemoptKind>() != MemoptKind::None)
    throw ConfigError(planner + " swaps and recomputes nothing (the paper's ZeRO rows): leave --memopt out, not " +
                      name_of(vm["memopt"].as<MemoptKind>()));
  if (given("zero-stage"))
    throw ConfigError(planner + " is its own ZeRO level; --zero-stage shards a pipeline's stage replicas: give one");
  if (vm.count("out")) throw ConfigError(planner + " makes no pipeline plan for --out to write");
  if (given("calibrate-rounds") || vm.count("calibrate-trace"))
    throw ConfigError(planner + " has no stages to calibrate: leave --calibrate-rounds and --calibrate-trace out");
}

int plan_zero_baseline(const po::variables_map& vm, const Profile& profile, const PlanSettings& options) {
  const ZeroBaselineOptions z = zero_baseline_options(options);
  const bool quiet = vm["quiet"].as<bool>();
  if (z.data_parallel == 1 && !quiet)
    std::printf("note: ZeRO-%d over --data-parallel 1 GPU shards nothing; give --data-parallel D for D GPUs\n",
                z.level);
  if (vm["max-batch"].as<bool>()) {
    const ZeroBaseline best = zero_max_batch(profile, z);
    std::printf("largest micro-batch size: %lld per GPU (%s: global batch %lld)\n",
                static_cast<long long>(best.micro_batch_size), zero_text(z.level, z.data_parallel).c_str(),
                static_cast<long long>(best.global_batch()));
    if (!quiet) print_zero_baseline(std::cout, best, z.capacity_bytes);
    return 0;
  }
  const ZeroBaseline at = zero_baseline(profile, z);
  if (!quiet) print_zero_baseline(std::cout, at, z.capacity_bytes);
  if (at.memory.peak() > z.capacity_bytes)
    throw InfeasibleError(zero_text(z.level, z.data_parallel) + " needs " +
                          format_bytes(static_cast<double>(at.memory.peak())) + " per GPU at micro-batch size " +
                          std::to_string(at.micro_batch_size) + ", above the " +
                          format_bytes(static_cast<double>(z.capacity_bytes)) + " it may fill");
  return 0;
}

}  // namespace dawnpiper
