#include "cli/train_options.h"

#include <algorithm>

#include "data/token_file.h"
#include "memory/device_memory.h"
#include "plan/zero_baseline.h"
#include "runtime/pipeline_stage.h"
#include "train/optimizer.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/files.h"
#include "util/units.h"

namespace dawnpiper {

namespace {

DataConfig data_config_from(const po::variables_map& vm) {
  DataConfig d;
  if (vm.count("data")) d.path = vm["data"].as<std::string>();
  d.sequential = vm["data-order"].as<DataOrder>() == DataOrder::Sequential;
  d.validation_fraction = vm["validation-fraction"].as<double>();
  if (d.validation_fraction < 0 || d.validation_fraction >= 1)
    throw ConfigError("--validation-fraction must be in [0, 1)");
  if (d.path.empty() && (!vm["data-order"].defaulted() || d.validation_fraction > 0))
    throw ConfigError("--data-order and --validation-fraction apply to --data (a token file)");
  if (!d.path.empty()) check_data_file(d.path);  // the file (a token file: and its metadata), before any work
  return d;
}

TrainConfig train_config_from(const po::variables_map& vm) {
  TrainConfig config;
  config.steps = vm["steps"].as<int64_t>();
  config.micro_batches = vm["micro-batches"].as<int64_t>();
  config.seed = vm["seed"].as<uint64_t>();
  config.optimizer.kind = vm["optimizer"].as<OptimizerKind>();
  config.optimizer.lr = vm["lr"].as<double>();
  config.optimizer.momentum = vm["momentum"].as<double>();
  config.optimizer.weight_decay = vm["weight-decay"].as<double>();
  config.optimizer.schedule.kind = vm["lr-schedule"].as<LrScheduleKind>();
  config.optimizer.schedule.warmup_steps = vm["warmup-steps"].as<int64_t>();
  config.optimizer.schedule.min_lr = vm["min-lr"].as<double>();
  config.optimizer.schedule.total_steps = config.steps;
  config.optimizer.grad_clip = vm["grad-clip"].as<double>();
  for (const ScheduleChoice& s : vm["schedule"].as<ScheduleRequest>().candidates())
    check_grad_clip(s, config.optimizer.grad_clip);
  make_optimizer(config.optimizer, {});  // validates before any work
  config.data = data_config_from(vm);
  if (config.micro_batches < 1) throw ConfigError("--micro-batches must be at least 1");
  if (config.steps < 1) throw ConfigError("--steps must be at least 1 (--eval-only evaluates without training)");
  // An option the chosen optimizer does not read is refused rather than ignored.
  if (config.optimizer.kind != OptimizerKind::Sgd && !vm["momentum"].defaulted())
    throw ConfigError("--momentum is SGD's; --optimizer " + std::string(name_of(config.optimizer.kind)) +
                      " keeps moving averages of its own (betas 0.9, 0.999): leave --momentum out");
  return config;
}

void read_memory(const po::variables_map& vm, TrainOptions& o) {
  if (vm.count("device-memory")) o.capacity = parse_capacity(vm["device-memory"].as<std::string>(), "--device-memory");
  if (vm.count("allocator-headroom")) {
    if (o.capacity == kUnlimitedBytes && o.device == DeviceKind::Cpu)
      throw ConfigError("--allocator-headroom is a share of the device memory: give --device-memory too");
    o.allocator_headroom = parse_allocator_headroom(vm["allocator-headroom"].as<std::string>());
  }
}

void read_evaluation(const po::variables_map& vm, TrainOptions& o) {
  o.eval_every = vm["eval-every"].as<int64_t>();
  o.eval_batches = vm["eval-batches"].as<int64_t>();
  if (o.eval_every < 0 || o.eval_batches < 1) throw ConfigError("--eval-every must be >= 0 and --eval-batches >= 1");
  o.eval_only = vm["eval-only"].as<bool>();
  if (o.eval_every == 0 && !o.eval_only && !vm["eval-batches"].defaulted())
    throw ConfigError(
        "--eval-batches sizes each validation, and this run has none: give --eval-every N (or --eval-only)");
  if ((o.eval_every > 0 || o.eval_only) && !o.config.data.path.empty() && o.config.data.validation_fraction <= 0)
    throw ConfigError(std::string(o.eval_only ? "--eval-only" : "--eval-every") +
                      " needs a validation split: give --validation-fraction (e.g. 0.05)");
  if (o.eval_only && (o.eval_every > 0 || vm.count("checkpoint-every") && !vm["checkpoint-every"].defaulted() ||
                      vm.count("save-weights") || vm.count("trace")))
    throw ConfigError(
        "--eval-only trains nothing: leave out --eval-every, --checkpoint-every, --save-weights and --trace");
}

void read_checkpointing(const po::variables_map& vm, TrainOptions& o) {
  o.checkpoint_every = vm["checkpoint-every"].as<int64_t>();
  o.resume = vm["resume"].as<bool>() || vm.count("resume-from");
  if (vm.count("resume-from")) o.resume_step = vm["resume-from"].as<int64_t>();
  if (vm.count("resume-from") && o.resume_step < 0) throw ConfigError("--resume-from must be a step (0 or more)");
  o.keep_checkpoints = vm["keep-checkpoints"].as<int>();
  if (o.keep_checkpoints < 1) throw ConfigError("--keep-checkpoints must be at least 1");
  o.resume_override = vm["resume-override"].as<bool>();
  if (o.resume_override && !o.resume) throw ConfigError("--resume-override applies to --resume");
  if (vm.count("checkpoint-dir")) o.checkpoint_dir = vm["checkpoint-dir"].as<std::string>();
  if (o.checkpoint_every < 0) throw ConfigError("--checkpoint-every must not be negative");
  if ((o.checkpoint_every > 0 || o.resume) && o.checkpoint_dir.empty())
    throw ConfigError("--checkpoint-every and --resume need --checkpoint-dir DIR");
}

// Inputs must be readable, and outputs writable (their directories made), before any work.
void read_files(const po::variables_map& vm, TrainOptions& o) {
  if (vm.count("trace")) o.trace_path = vm["trace"].as<std::string>();
  if (vm.count("save-weights")) {  // a .safetensors file, or a directory for it and config.json
    const std::string given = vm["save-weights"].as<std::string>();
    const std::string suffix = ".safetensors";
    const bool file =
        given.size() > suffix.size() && given.compare(given.size() - suffix.size(), suffix.size(), suffix) == 0;
    o.save_directory = file ? "" : given;
    o.save_path = file ? given : given + "/model.safetensors";
  }
  if (vm.count("metrics-out")) o.metrics_path = vm["metrics-out"].as<std::string>();
  if (vm.count("torch-trace")) o.torch_trace_path = vm["torch-trace"].as<std::string>();
  for (const char* input : {"init-from", "profile-in", "plan-in"})
    if (vm.count(input)) check_readable(vm[input].as<std::string>(), std::string("--") + input);
  if (vm.count("calibrate-trace"))
    for (const std::string& trace : vm["calibrate-trace"].as<std::vector<std::string>>())
      check_readable(trace, "--calibrate-trace");
  if (o.in_process && (!o.trace_path.empty() || !o.checkpoint_dir.empty()))
    throw ConfigError("--trace and --checkpoint-dir apply to MPI runs, not --in-process");
  if (o.in_process && !o.save_path.empty())
    throw ConfigError("--save-weights applies to MPI runs and one-stage runs, not --in-process");
  if (o.in_process && (o.eval_every > 0 || o.eval_only))
    throw ConfigError("--eval-every and --eval-only apply to MPI runs and one-stage runs, not --in-process");
  // Outputs: their directories are made now, and each must be writable before any work.
  if (vm.count("plan-out")) o.plan_out = vm["plan-out"].as<std::string>();
  for (const std::string& path : {o.trace_path, o.save_path, o.metrics_path, o.plan_out, o.torch_trace_path})
    if (!path.empty()) {
      if (const std::string dir = parent_directory(path); !dir.empty()) make_directories(dir);
      check_writable(path);
    }
}

// Where and how the stages run, and what the plan is made from.
void read_placement(const po::variables_map& vm, TrainOptions& o) {
  o.plan = plan_request_from(vm);
  o.plan.replica_bandwidth = replica_bandwidth_option(vm);
  const double drag = replica_drag_option(vm);
  o.replica_drag_given = drag >= 0;
  o.plan.replica_drag = std::max(0.0, drag);
  if (is_zero_baseline(o.plan.planner))
    throw ConfigError(std::string("--planner ") + name_of(o.plan.planner) +
                      " is ZeRO's data-parallel baseline that `dawnpiper plan` computes, no pipeline plan to train");
  o.device = vm["device"].as<DeviceKind>();
  o.transport = vm["transport"].as<TransportKind>();
  o.threads_requested = vm["threads"].as<int>();
  if (o.threads_requested < 0) throw ConfigError("--threads must be positive (0: choose)");
  if (vm.count("plan-in")) o.plan_in = vm["plan-in"].as<std::string>();
  if (vm.count("profile-in")) o.profile_in = vm["profile-in"].as<std::string>();
  o.profile_cache = vm["profile-cache"].as<std::string>();
  if (vm.count("calibrate-trace")) o.calibrate_traces = vm["calibrate-trace"].as<std::vector<std::string>>();
  if (!o.plan_in.empty())
    for (const char* planning :
         {"profile-in", "profile-cache", "allocator-headroom", "replica-bandwidth", "replica-drag"})
      if (vm.count(planning) && !vm[planning].defaulted())
        throw ConfigError("--" + std::string(planning) +
                          " shapes the plan a run makes; --plan-in gives one made before");
  if (!o.plan_in.empty() && !o.calibrate_traces.empty())
    throw ConfigError(
        "--calibrate-trace corrects the profile a plan is made from; --plan-in gives the plan (make it "
        "with `dawnpiper plan --calibrate-trace`)");
}

}  // namespace

po::options_description train_options() {
  po::options_description own("Training options");
  // clang-format off
  own.add_options()
      ("profile-in", po::value<std::string>(), "plan from this profile instead of profiling first")
      ("plan-in", po::value<std::string>(), "train with this plan (JSON from `dawnpiper plan --out`)")
      ("calibrate-trace", po::value<std::vector<std::string>>()->composing(),
       "plan from the profile with each traced stage's node times scaled to what that run measured (`--trace` "
       "of an earlier run of this setup; several: each node takes the mean of its factors)")
      ("profile-cache", po::value<std::string>()->default_value(""),
       "where measured profiles are kept and reused: a directory, or off (default: $DAWNPIPER_CACHE, else "
       "$XDG_CACHE_HOME/dawnpiper or ~/.cache/dawnpiper)")
      ("plan-out", po::value<std::string>(), "write the plan used to this file")
      ("replica-bandwidth", po::value<std::string>(), "bytes/s between a stage's replicas, which the plan's gradient "
                                                      "collectives take, instead of measuring it over MPI before "
                                                      "planning, e.g. 2GB")
      ("replica-drag", po::value<double>(), "ms a computing rank's pass takes longer per ms of its replicas' "
                                            "collectives beside it, instead of measuring it before planning "
                                            "(the CPU; 0 on a GPU: NCCL runs beside the compute)")
      ("transport", po::value<TransportKind>()->default_value(TransportKind::Auto, "auto"), enum_help<TransportKind>().c_str())
      ("in-process", po::bool_switch(), "run every stage in this one process (validates a plan without MPI)")
      ("threads", po::value<int>()->default_value(0), "intra-op threads per rank (default: OMP_NUM_THREADS if set, else "
                                                    "the node's cores / the ranks on it)")
      ("trace", po::value<std::string>(), "write an HDF5 trace of every action on every rank (docs/trace-format.md)")
      ("checkpoint-dir", po::value<std::string>(), "directory for checkpoints (every stage's parameters and optimizer state): one "
                                                   "after the last step, and where a signal stops the run")
      ("checkpoint-every", po::value<int64_t>()->default_value(0), "write a checkpoint every K steps (and after the last)")
      ("save-weights", po::value<std::string>(), "after training, write the weights to this safetensors file (PyTorch names: "
                                                 "transformers' from_pretrained loads it)")
      ("progress", po::value<ProgressKind>()->default_value(ProgressKind::Auto, "auto"), enum_help<ProgressKind>().c_str())
      ("resume", po::bool_switch(), "continue from the latest checkpoint in --checkpoint-dir (with the model, data and "
                                    "optimizer settings of the run that wrote it)")
      ("resume-from", po::value<int64_t>(), "continue from the checkpoint of this step in --checkpoint-dir (one of the "
                                            "kept ones; --resume takes the latest)")
      ("keep-checkpoints", po::value<int>()->default_value(2), "complete checkpoints kept in --checkpoint-dir (older ones "
                                                               "are removed once a newer one is complete)")
      ("resume-override", po::bool_switch(), "with --resume: accept settings that differ from the checkpoint's run")
      ("steps", po::value<int64_t>()->default_value(10), "training steps")
      ("data", po::value<std::string>(), "train on this token file (scripts/prepare_data.py) or sample file (*.safetensors: an array per input) instead of synthetic data")
      ("data-order", po::value<DataOrder>()->default_value(DataOrder::Shuffled, "shuffled"), enum_help<DataOrder>().c_str())
      ("validation-fraction", po::value<double>()->default_value(0.0), "share of the token file's windows held out for validation")
      ("eval-every", po::value<int64_t>()->default_value(0), "report the validation loss every N steps (0: never)")
      ("eval-batches", po::value<int64_t>()->default_value(4), "micro-batches of the validation split per evaluation")
      ("eval-only", po::bool_switch(), "report the validation loss of the starting weights (--resume's checkpoint, "
                                       "--init-from's or the seed's) and train nothing")
      ("lr", po::value<double>()->default_value(0.01), "learning rate (the schedule's peak)")
      ("momentum", po::value<double>()->default_value(0.9), "SGD momentum")
      ("weight-decay", po::value<double>()->default_value(0.0), "weight decay of matrices and embeddings (not of biases "
                                                                 "and norms): decoupled under adamw, L2 under sgd and adam")
      ("lr-schedule", po::value<LrScheduleKind>()->default_value(LrScheduleKind::Constant, name_of(LrScheduleKind::Constant)),
       (enum_help<LrScheduleKind>() + " (cosine and linear decay to --min-lr at the last step), after --warmup-steps "
        "(transformers' schedules)").c_str())
      ("warmup-steps", po::value<int64_t>()->default_value(0), "steps of linear warmup from 0 to --lr")
      ("min-lr", po::value<double>()->default_value(0.0), "where cosine and linear decay end")
      ("grad-clip", po::value<double>()->default_value(0.0), "clip the global gradient norm (over every stage) to this before each "
                                                            "update, as clip_grad_norm_; 0: never (the norm is reported either way)")
      ("metrics-out", po::value<std::string>(), "append one JSON line per step and validation to this file (step, loss, lr, "
                                                "grad norm, samples/s and tokens/s, peak memory per stage); scripts/plot_metrics.py draws it")
      ("torch-trace", po::value<std::string>(), "write PyTorch's profiler trace of rank 0 (operators and, on CUDA, kernels and "
                                                "copies) over steps 2-3 to this Chrome trace file (Perfetto reads it)");
  // clang-format on
  po::options_description options;
  options.add(own)
      .add(planning_options())
      .add(run_options())
      .add(allocator_headroom_option())
      .add(model_override_options());
  return options;
}

TrainOptions read_train_options(const po::variables_map& vm) {
  TrainOptions o;
  o.config = train_config_from(vm);
  o.micro_batch_size = vm["micro-batch-size"].as<int64_t>();
  read_evaluation(vm, o);
  o.quiet = vm["quiet"].as<bool>();
  o.progress = vm["progress"].as<ProgressKind>();
  o.in_process = vm["in-process"].as<bool>();
  read_checkpointing(vm, o);
  read_files(vm, o);
  read_placement(vm, o);
  read_memory(vm, o);  // after the device: a CUDA run has a memory budget without --device-memory
  return o;
}

void adopt_plan_settings(const Plan& plan, po::variables_map& vm, bool resumed) {
  const PlannedRun planned = planned_run(plan);
  // True where the command line or config file gives the option a value that differs from the plan's.
  auto differs = [&](const PlannedOption& option) {
    auto found = vm.find(option.key);
    return found != vm.end() && !found->second.defaulted() &&
           !option.agrees(found->second.value(), option.value(planned));
  };
  bool other_schedule = false;
  for (const PlannedOption& option : planned_options())
    if (option.key == "schedule") other_schedule = differs(option);
  // A resumed run compares the rest with the checkpoint's run (run/resume.h), and the plan's
  // stages, replicas and memory with this run where the plan is agreed (run/agreed_plan.h).
  for (const PlannedOption& option : planned_options()) {
    if (resumed && (!option.resumed || (option.with_schedule && other_schedule))) continue;
    const boost::any value = option.value(planned);
    if (differs(option)) {
      if (resumed) continue;  // a resumed run keeps the value given and plans anew (run/agreed_plan.h)
      throw ConfigError("--" + option.key + " " + option.text(vm[option.key].value()) +
                        " contradicts the plan (--plan-in), made for " + option.text(value) +
                        "; leave the option out or plan again");
    }
    vm.erase(option.key);
    vm.insert({option.key, po::variable_value(value, false)});
  }
}

}  // namespace dawnpiper
