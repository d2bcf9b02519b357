// dawnpiper: one SPMD binary for every subcommand (train, graph, ...). User errors print one
// line and exit non-zero; with several MPI ranks an error every rank hits ends the job in order,
// and a rank failing alone aborts the whole job so that no rank is left waiting.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <functional>
#include <exception>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include <c10/util/Exception.h>

#include "app/commands.h"
#include "util/error.h"
#include "util/mpi_launcher.h"

namespace {

using Command = int (*)(int, char**, const dawnpiper::MpiWorld&);

const std::map<std::string, std::pair<Command, const char*>>& commands() {
  static const std::map<std::string, std::pair<Command, const char*>> table = {
      {"train", {dawnpiper::cmd_train, "train a model (default subcommand)"}},
      {"graph", {dawnpiper::cmd_graph, "build a model's op graph and summarize it"}},
      {"profile", {dawnpiper::cmd_profile, "measure per-node time and memory into an HDF5 profile"}},
      {"plan", {dawnpiper::cmd_plan, "partition a profiled model into pipeline stages"}},
      {"inspect", {dawnpiper::cmd_inspect, "summarize a training trace per stage"}},
      {"run-stage", {dawnpiper::cmd_run_stage, "run one stage of a plan alone and measure it"}},
      {"export-weights", {dawnpiper::cmd_export_weights, "write a checkpoint's weights as safetensors (CKPT DIR)"}},
  };
  return table;
}

void usage() {
  std::cout << "usage: dawnpiper <subcommand> [options]   (dawnpiper <subcommand> --help)\n\nsubcommands:\n";
  for (const auto& kv : commands()) std::printf("  %-14s %s\n", kv.first.c_str(), kv.second.second);
}

// Only `train` and `run-stage` use MPI itself; the other subcommands do their work on rank
// 0. Run alone (no launcher), they skip MPI_Init: an Open MPI singleton start costs ~0.5 s,
// half of a `plan` of a small model.
bool needs_mpi(const std::string& subcommand) {
  return dawnpiper::under_mpi_launcher() || subcommand == "train" || subcommand == "run-stage";
}

void finalize_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Finalize();
}

// Failing ranks meet here; a communicator of its own, so that no pending collective elsewhere
// interferes.
MPI_Comm failure_comm = MPI_COMM_NULL;

// Whether every rank reached fail() within `seconds` (a barrier on failure_comm).
bool all_ranks_failed(double seconds) {
  MPI_Request request;
  MPI_Ibarrier(failure_comm, &request);
  const double start = MPI_Wtime();
  int done = 0;
  while (!done && MPI_Wtime() - start < seconds) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) usleep(10000);
  }
  return done != 0;
}

// An error every rank hits (options, a config file) ends the job in order: rank 0 prints it
// once (other ranks only a different message of their own) and every rank exits with the code,
// without MPI_Abort's kill and the transport noise that follows it. A rank that fails alone
// aborts the job, so that no rank waits for it.
[[noreturn]] void fail(const dawnpiper::MpiWorld& world, const std::string& message, int code) {
  std::fflush(stdout);
  if (world.size > 1 && all_ranks_failed(2.0)) {
    uint64_t mine = std::hash<std::string>{}(message), first = mine;
    MPI_Bcast(&first, 1, MPI_UINT64_T, 0, failure_comm);
    if (world.rank == 0)
      std::fprintf(stderr, "dawnpiper: error: %s\n", message.c_str());
    else if (mine != first)
      std::fprintf(stderr, "dawnpiper: error on rank %d: %s\n", world.rank, message.c_str());
    std::fflush(stderr);
    MPI_Finalize();
    std::exit(code);
  }
  if (world.size > 1) {
    std::fprintf(stderr, "dawnpiper: error on rank %d: %s\n", world.rank, message.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  std::fprintf(stderr, "dawnpiper: error: %s\n", message.c_str());
  finalize_mpi();
  std::exit(code);
}

// Levenshtein distance: how many single-letter edits turn a into b.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// One line: the name, the closest subcommand when one is a couple of edits away, where the list is.
std::string unknown_subcommand(const std::string& name) {
  std::string closest;
  size_t best = 3;  // more edits than 2 suggest nothing
  for (const auto& kv : commands())
    if (const size_t d = edit_distance(name, kv.first); d < best) best = d, closest = kv.first;
  return "unknown subcommand '" + name + "'" + (closest.empty() ? "" : " (did you mean " + closest + "?)") +
         "; `dawnpiper --help` lists them";
}

}  // namespace

int main(int argc, char** argv) {
  std::string name = "train";
  int shift = 1;
  const bool help = argc > 1 && (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h"));
  if (argc > 1 && argv[1][0] != '-') {
    name = argv[1];
    shift = 2;
  }
  dawnpiper::MpiWorld world;
  if (needs_mpi(help ? "" : name)) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world.size);
    MPI_Comm_dup(MPI_COMM_WORLD, &failure_comm);
  }
  if (help) {
    if (world.rank == 0) usage();
    finalize_mpi();
    return 0;
  }
  auto it = commands().find(name);
  if (it == commands().end()) fail(world, unknown_subcommand(name), 2);
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
  finalize_mpi();
  return code;
}
