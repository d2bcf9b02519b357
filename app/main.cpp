// dawnpiper: one SPMD binary for every subcommand (train, graph, ...). User errors print one
// line and exit non-zero; with several MPI ranks a failing rank aborts the whole job so that no
// rank is left waiting.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>
#include <string>

#include <c10/util/Exception.h>

#include "app/commands.h"
#include "util/error.h"

namespace {

using Command = int (*)(int, char**, const dawnpiper::MpiWorld&);

const std::map<std::string, std::pair<Command, const char*>>& commands() {
  static const std::map<std::string, std::pair<Command, const char*>> table = {
      {"train", {dawnpiper::cmd_train, "train a model (default subcommand)"}},
      {"graph", {dawnpiper::cmd_graph, "build a model's op graph and summarize it"}},
      {"profile", {dawnpiper::cmd_profile, "measure per-node time and memory into an HDF5 profile"}},
      {"plan", {dawnpiper::cmd_plan, "partition a profiled model into pipeline stages"}},
      {"inspect", {dawnpiper::cmd_inspect, "summarize a training trace per stage"}},
      {"replay-stage", {dawnpiper::cmd_replay_stage, "run one stage of a plan alone and measure it"}},
  };
  return table;
}

void usage() {
  std::cout << "usage: dawnpiper <subcommand> [options]   (dawnpiper <subcommand> --help)\n\nsubcommands:\n";
  for (const auto& kv : commands()) std::printf("  %-14s %s\n", kv.first.c_str(), kv.second.second);
}

[[noreturn]] void fail(const dawnpiper::MpiWorld& world, const std::string& message, int code) {
  std::fflush(stdout);
  if (world.size > 1) {
    std::fprintf(stderr, "dawnpiper: error on rank %d: %s\n", world.rank, message.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  std::fprintf(stderr, "dawnpiper: error: %s\n", message.c_str());
  MPI_Finalize();
  std::exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  dawnpiper::MpiWorld world;
  MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world.size);

  std::string name = "train";
  int shift = 1;
  if (argc > 1 && argv[1][0] != '-') {
    name = argv[1];
    shift = 2;
  } else if (argc > 1 && (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h"))) {
    if (world.rank == 0) usage();
    MPI_Finalize();
    return 0;
  }
  auto it = commands().find(name);
  if (it == commands().end()) {
    if (world.rank == 0) usage();
    fail(world, "unknown subcommand '" + name + "'", 2);
  }
  // Boost.Program_options expects argv[0] to be the program name: hand it the subcommand's argv.
  int sub_argc = argc - shift + 1;
  char** sub_argv = argv + shift - 1;
  int code = 0;
  try {
    code = it->second.first(sub_argc, sub_argv, world);
  } catch (const dawnpiper::Error& e) {
    fail(world, e.what(), e.exit_code());
  } catch (const c10::Error& e) {
    fail(world, std::string("LibTorch: ") + e.what_without_backtrace(), 5);
  } catch (const std::exception& e) {
    fail(world, std::string("internal error (please report): ") + e.what(), 70);
  }
  std::fflush(stdout);
  MPI_Finalize();
  return code;
}
