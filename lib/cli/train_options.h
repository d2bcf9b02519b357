#pragma once
// What `dawnpiper train` takes: its options, and the settings read from them once, checked (every
// input readable, every output writable) before any work.
#include <cstdint>
#include <string>
#include <vector>

#include "cli/options.h"
#include "plan/plan.h"
#include "runtime/device_placement.h"
#include "train/reference_trainer.h"

namespace dawnpiper {

po::options_description train_options();

struct TrainOptions {
  TrainConfig config;
  int64_t micro_batch_size = 0;
  // What the run asks of its plan (cli/options.h: plan_request_from): ranks and data_parallel 0
  // where not given (the MPI ranks decide); its capacity is set where rank 0 plans (run/agreed_plan).
  PlanRequest plan;
  DeviceKind device = DeviceKind::Cpu;
  TransportKind transport = TransportKind::Auto;
  int threads_requested = 0;                        // 0: choose
  int64_t capacity = kUnlimitedBytes;               // bytes per rank
  std::string capacity_source = "--device-memory";  // where `capacity` came from, for messages
  double allocator_headroom = -1;  // share of `capacity` a plan made here leaves free; < 0: the device's default
  int64_t eval_every = 0, eval_batches = 1;
  int64_t checkpoint_every = 0;
  int keep_checkpoints = 2;  // complete checkpoints kept in checkpoint_dir
  // --resume-from STEP (-1: the one `latest` names); app/cmd_train sets it to the step checked.
  int64_t resume_step = -1;
  bool resume = false, resume_override = false, quiet = false, in_process = false, eval_only = false;
  std::string checkpoint_dir, trace_path, save_path, metrics_path;
  std::string torch_trace_path;  // --torch-trace: PyTorch's profiler on rank 0 over steps 2-3
  std::string save_directory;    // --save-weights DIR: model.safetensors and (Hugging Face models) config.json
  std::string plan_in, plan_out, profile_in, profile_cache;
  std::vector<std::string> calibrate_traces;
  bool replica_drag_given = false;  // --replica-drag (plan.replica_drag): not measured
  ProgressKind progress = ProgressKind::Auto;
  // Set where the run starts, from what the options select.
  std::string hf_config;  // config.json's text for --save-weights DIR; empty: not a Hugging Face export
  ThreadCount threads;    // each rank's intra-op threads
  double samples_per_step = 0;
  // Model FLOPs of one sample's forward and backward, and the dense peak FLOP/s of every GPU the
  // run uses (0: not known) with what it is: for the model FLOP/s and MFU the run reports.
  double flops_per_sample = 0, peak_flops = 0;
  std::string peak_what;
};
TrainOptions read_train_options(const po::variables_map& vm);

// Takes a --plan-in's schedule, micro-batching, optimizer, planner, memory optimization,
// precision and stage count into vm; a value given on the command line or in the config file
// that differs is a ConfigError naming both. `resumed`: the plan of the checkpoint a --resume
// continues, whose schedule, planner, memory optimization and micro-batching it takes where
// none is given; a value given that differs stays, and the run plans anew for it
// (run/agreed_plan.h). The rest is the checkpoint's run's to compare (run/resume.h).
void adopt_plan_settings(const Plan& plan, po::variables_map& vm, bool resumed = false);

}  // namespace dawnpiper
