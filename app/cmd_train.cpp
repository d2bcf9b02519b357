// dawnpiper train: the reference trainer for one stage; for several stages the SPMD pipeline:
// rank 0 profiles and plans (or loads a profile / a plan), broadcasts the plan, and every rank
// builds and trains only its own stage (lib/run/training_run.h).
#include <cstdio>
#include <utility>

#include "app/commands.h"
#include "cli/train_options.h"
#include "run/resume.h"
#include "run/training_run.h"

namespace dawnpiper {

int cmd_train(int argc, char** argv, const MpiWorld& world) {
  po::variables_map vm;
  if (!parse_options(argc, argv, "train",
                     "Trains a model: one stage with the reference trainer, several as a pipeline.", train_options(),
                     vm))
    return 0;
  // A resumed run's checkpoint is checked first: a missing or damaged one is named before
  // anything is printed or profiled.
  const bool resumed = vm["resume"].as<bool>() || vm.count("resume-from");
  int64_t resume_step = -1;
  if (resumed && vm.count("checkpoint-dir"))
    resume_step = agreed_resume_step(vm["checkpoint-dir"].as<std::string>(),
                                     vm.count("resume-from") ? vm["resume-from"].as<int64_t>() : -1, world.rank);
  // A given plan decides how the run trains; flags and config values may only repeat it.
  const std::optional<GivenPlan> given =
      read_given_plan(vm.count("plan-in") ? vm["plan-in"].as<std::string>() : "", world.rank);
  if (given) adopt_plan_settings(given->plan, vm);
  // A resumed run takes its checkpoint's plan settings where the command line is silent; a flag
  // that asks for another schedule, planner, memory optimization or micro-batching makes it plan
  // anew (run/agreed_plan.h).
  if (!given && resumed && vm.count("checkpoint-dir")) {
    const std::string dir = vm["checkpoint-dir"].as<std::string>();
    if (const std::optional<GivenPlan> saved = read_checkpoint_plan(dir, world.rank))
      adopt_plan_settings(saved->plan, vm, /*resumed=*/true);
  }
  TrainOptions options = read_train_options(vm);  // checks its inputs before the model reads any
  if (resumed) options.resume_step = resume_step;
  // The same command with --resume added continues a run that started from --init-from: said,
  // not ignored.
  if (resumed && vm.count("init-from") && world.rank == 0 && !options.quiet)
    std::printf("note: --resume: the checkpoint's weights replace --init-from's\n");
  return run_training(std::move(options), model_source_from(vm), given, world.rank, world.size);
}

}  // namespace dawnpiper
