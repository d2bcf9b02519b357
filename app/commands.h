#pragma once
// The subcommands of the dawnpiper binary. Each returns the process exit code and throws
// dawnpiper::Error for user errors (main prints them).
namespace dawnpiper {

struct MpiWorld {
  int rank = 0;
  int size = 1;
};

int cmd_train(int argc, char** argv, const MpiWorld& world);
int cmd_graph(int argc, char** argv, const MpiWorld& world);
int cmd_profile(int argc, char** argv, const MpiWorld& world);
int cmd_plan(int argc, char** argv, const MpiWorld& world);
int cmd_inspect(int argc, char** argv, const MpiWorld& world);
int cmd_run_stage(int argc, char** argv, const MpiWorld& world);
int cmd_export_weights(int argc, char** argv, const MpiWorld& world);

}  // namespace dawnpiper
