// dawnpiper inspect: per-stage summary of a training trace (busy time, idle fraction, peak
// memory against the plan's prediction, bytes sent, throughput).
#include <iostream>

#include "app/commands.h"
#include "cli/options.h"
#include "trace/trace.h"
#include "util/error.h"

namespace dawnpiper {

int cmd_inspect(int argc, char** argv, const MpiWorld& world) {
  po::options_description options("Inspect options");
  // clang-format off
  options.add_options()("trace", po::value<std::string>(), "the HDF5 trace (`dawnpiper train --trace`); also positional");
  // clang-format on
  po::positional_options_description positional;
  positional.add("trace", 1);
  po::variables_map vm;
  if (!parse_options(argc, argv, "inspect", "Summarizes a training trace per stage.", options, vm, &positional))
    return 0;
  if (!vm.count("trace")) throw ConfigError("give the trace file: dawnpiper inspect TRACE.h5");
  if (world.rank != 0) return 0;
  print_summary(read_trace(vm["trace"].as<std::string>()), std::cout);
  return 0;
}

}  // namespace dawnpiper
