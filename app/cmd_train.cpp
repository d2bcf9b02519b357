// dawnpiper train: the reference trainer for one stage; for several stages the SPMD pipeline:
// rank 0 profiles and plans (or loads a profile / a plan), broadcasts the plan, and every rank
// builds and trains only its own stage.
#include <ATen/Parallel.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <cinttypes>
#include <optional>
#include <sstream>
#include <type_traits>
#include <climits>
#include <cstdio>
#include <fstream>

#include "app/commands.h"
#include "cli/options.h"
#include "memory/counting_allocator.h"
#include "memory/device_memory.h"
#include "models/model_file.h"
#include "plan/calibrate.h"
#include "plan/memory_optimizer.h"
#include "plan/planner.h"
#include "profile/profile_cache.h"
#include "profile/profile_io.h"
#include "profile/profiler.h"
#include "runtime/pipeline.h"
#include "train/metrics_log.h"
#include "train/reference_trainer.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/files.h"
#include "util/json.h"
#include "util/progress.h"
#include "util/stop_request.h"
#include "util/units.h"
#include "trace/trace.h"
#include "runtime/checkpoint.h"
#include "runtime/device_placement.h"
#include "runtime/rank_layout.h"
#include "runtime/run_records.h"
#include "runtime/mpi_wait.h"
#include "runtime/stage_tracer.h"
#include "runtime/weights_export.h"

namespace dawnpiper {

namespace {

// The profile train plans from: measured here, or the one measured before under the same key
// (profile/profile_cache.h), so that runs of one setup plan from the same numbers.
Profile measured_profile(const po::variables_map& vm, const OpGraph& graph, c10::Device device) {
  ProfilerOptions options;
  options.warmup = 1;
  options.iterations = 3;
  options.seed = vm["seed"].as<uint64_t>();
  options.device = device;
  const bool quiet = vm["quiet"].as<bool>();
  const std::string dir = profile_cache_dir(vm["profile-cache"].as<std::string>());
  const std::string settings = device.str() + " threads " + std::to_string(at::get_num_threads()) + " warmup " +
                               std::to_string(options.warmup) + " iterations " + std::to_string(options.iterations) +
                               " seed " + std::to_string(options.seed);
  const std::string path = dir.empty() ? "" : profile_cache_path(dir, graph, settings);
  if (!path.empty())
    if (std::optional<Profile> cached = read_cached_profile(path, graph)) {
      if (!quiet) std::printf("profile: %s (cached; --profile-cache off measures afresh)\n", path.c_str());
      return std::move(*cached);
    }
  Profile profile = profile_graph(graph, options);
  if (!path.empty()) {
    const bool kept = write_cached_profile(path, profile);
    if (!quiet) std::printf("profile: measured, %s %s\n", kept ? "kept in" : "could not keep it in", path.c_str());
  }
  return profile;
}

// Rank 0: a plan made from a loaded or freshly measured profile, as JSON.
std::string plan_on_rank0(const po::variables_map& vm, const OpGraph& graph, int stages, int replicas, int64_t capacity,
                          double headroom_share, c10::Device device) {
  Profile profile;
  if (vm.count("profile-in")) {
    profile = read_profile(vm["profile-in"].as<std::string>());
    if (const std::string why = profile.device_mismatch(device.str()); !why.empty())
      throw ConfigError("--profile-in: " + why);
    if (profile.precision != graph.precision)
      throw ConfigError("--profile-in was profiled in " + profile.precision + ", this run trains in " +
                        graph.precision + " (profile again with --precision " + graph.precision + ")");
    if (profile.preset != graph.preset || profile.size() != graph.size())
      throw ConfigError("--profile-in is a profile of " + profile.preset + " (" + std::to_string(profile.size()) +
                        " nodes), not of this " + graph.preset + " graph (" + std::to_string(graph.size()) + " nodes)");
    profile = profile.at_batch(graph.micro_batch_size);
  } else {
    profile = measured_profile(vm, graph, device);
  }
  if (vm.count("calibrate-trace")) {
    const auto& traces = vm["calibrate-trace"].as<std::vector<std::string>>();
    calibrate_from_traces(profile, traces);
    if (!vm["quiet"].as<bool>())
      std::printf("profile: node times scaled to what %zu traced run(s) measured\n", traces.size());
  }
  PlanOptions o;
  o.stages = stages;
  o.schedule = vm["schedule"].as<ScheduleKind>();
  o.micro_batches = vm["micro-batches"].as<int64_t>();
  o.optimizer = vm["optimizer"].as<OptimizerKind>();
  set_device_memory(o, capacity > 0 ? capacity : INT64_MAX, headroom_share);
  o.planner = vm["planner"].as<PlannerKind>();
  o.memopt = vm["memopt"].as<MemoptMode>();
  o.fit_replayed = true;
  o.data_parallel = replicas;
  Plan plan = make_plan(profile, o);
  return plan.to_json();
}

DataConfig data_config_from(const po::variables_map& vm) {
  DataConfig d;
  if (vm.count("data")) d.path = vm["data"].as<std::string>();
  d.sequential = vm["data-order"].as<DataOrder>() == DataOrder::Sequential;
  d.validation_fraction = vm["validation-fraction"].as<double>();
  if (d.validation_fraction < 0 || d.validation_fraction >= 1)
    throw ConfigError("--validation-fraction must be in [0, 1)");
  if (d.path.empty() && (!vm["data-order"].defaulted() || d.validation_fraction > 0))
    throw ConfigError("--data-order and --validation-fraction apply to --data (a token file)");
  if (!d.path.empty()) TokenFile check(d.path);  // the file and its metadata, before any work
  return d;
}

// Takes the plan's schedule, micro-batching, optimizer, planner, memory optimization, precision
// and stage count into vm; a value given on the command line or in the config file that differs
// is a ConfigError naming both.
void adopt_plan_settings(const Plan& plan, po::variables_map& vm) {
  auto adopt = [&](const char* key, const auto& planned) {
    using T = std::decay_t<decltype(planned)>;
    auto found = vm.find(key);
    if (found != vm.end() && !found->second.defaulted() && found->second.template as<T>() != planned) {
      std::ostringstream given, wanted;
      given << found->second.template as<T>();
      wanted << planned;
      throw ConfigError("--" + std::string(key) + " " + given.str() + " contradicts the plan (--plan-in), made for " +
                        wanted.str() + "; leave the option out or plan again");
    }
    vm.erase(key);
    vm.insert({key, po::variable_value(boost::any(planned), false)});
  };
  adopt("schedule", plan.options.schedule);
  adopt("micro-batch-size", plan.micro_batch_size);
  adopt("micro-batches", plan.options.micro_batches);
  adopt("optimizer", plan.options.optimizer);
  adopt("planner", plan.options.planner);
  adopt("memopt", plan.options.memopt);
  adopt("precision", plan.precision);
  adopt("stages", static_cast<int>(plan.stages.size()));
  adopt("data-parallel", plan.options.data_parallel);
}

// This rank's place: its stage and replica (runtime/rank_layout.h), or every stage here.
RankLayout layout_from(const po::variables_map& vm, const MpiWorld& world, bool in_process) {
  const int dp = vm.count("data-parallel") ? vm["data-parallel"].as<int>() : 0;
  if (vm.count("data-parallel") && dp < 1) throw ConfigError("--data-parallel must be at least 1");
  const int stages = vm.count("stages") ? vm["stages"].as<int>() : 0;
  if (vm.count("stages") && stages < 1) throw ConfigError("--stages must be at least 1");
  if (!in_process) return rank_layout(stages, dp, MPI_COMM_WORLD);
  if (world.size != 1) throw ConfigError("--in-process runs every stage in one process: launch one rank");
  if (dp > 1) throw ConfigError("--data-parallel needs MPI ranks, not --in-process");
  return in_process_layout(std::max(stages, 1));
}

po::options_description train_options() {
  po::options_description own("Training options");
  // clang-format off
  own.add_options()
      ("stages", po::value<int>(), "pipeline stages (default: the number of MPI ranks / --data-parallel)")
      ("data-parallel", po::value<int>(), "pipeline replicas D training on their own shares of the data, their gradients "
                                          "averaged every step (default: MPI ranks / --stages); a pipeline's ranks share a node where they can")
      ("schedule", po::value<ScheduleKind>()->default_value(ScheduleKind::OneFOneB, "1f1b"), "gpipe | 1f1b | async (PipeDream, weight stashing)")
      ("planner", po::value<PlannerKind>()->default_value(PlannerKind::DawnPiper, "dawnpiper"), "dawnpiper | gpipe | pipedream | vpipe | even | exact")
      ("memopt", po::value<MemoptMode>()->default_value(MemoptMode::None, "none"), "memory optimization the plan may use: none | r (recompute) | sr (swap + recompute); the runtime carries out its per-tensor decisions")
      ("profile-in", po::value<std::string>(), "plan from this profile instead of profiling first")
      ("plan-in", po::value<std::string>(), "train with this plan (JSON from `dawnpiper plan --out`)")
      ("calibrate-trace", po::value<std::vector<std::string>>()->composing(),
       "plan from the profile with each traced stage's node times scaled to what that run measured (`--trace` "
       "of an earlier run of this setup; several: each node takes the mean of its factors)")
      ("profile-cache", po::value<std::string>()->default_value(""),
       "where measured profiles are kept and reused: a directory, or off (default: $DAWNPIPER_CACHE, else "
       "$XDG_CACHE_HOME/dawnpiper or ~/.cache/dawnpiper)")
      ("plan-out", po::value<std::string>(), "write the plan used to this file")
      ("transport", po::value<TransportChoice>()->default_value(TransportChoice::Auto, "auto"),
       "auto | mpi (CPU tensors) | nccl (CUDA, ranks on different GPUs) | host (CUDA through host memory over MPI; "
       "what auto takes between ranks sharing a GPU)")
      ("in-process", po::bool_switch(), "run every stage in this one process (validates a plan without MPI)")
      ("threads", po::value<int>()->default_value(0), "intra-op threads per rank (default: OMP_NUM_THREADS if set, else "
                                                    "the node's cores / the ranks on it)")
      ("trace", po::value<std::string>(), "write an HDF5 trace of every action on every rank (docs/trace-format.md)")
      ("checkpoint-dir", po::value<std::string>(), "directory for checkpoints (every stage's parameters and optimizer state)")
      ("checkpoint-every", po::value<int64_t>()->default_value(0), "write a checkpoint every K steps (and after the last)")
      ("save-weights", po::value<std::string>(), "after training, write the weights to this safetensors file (PyTorch names: "
                                                 "transformers' from_pretrained loads it)")
      ("progress", po::value<Progress::Style>()->default_value(Progress::Style::Auto, "auto"),
       "auto (a bar on a terminal, lines in logs and under mpirun) | bar | lines")
      ("resume", po::bool_switch(), "continue from the latest checkpoint in --checkpoint-dir (with the model, data and "
                                    "optimizer settings of the run that wrote it)")
      ("resume-override", po::bool_switch(), "with --resume: accept settings that differ from the checkpoint's run")
      ("steps", po::value<int64_t>()->default_value(10), "training steps")
      ("data", po::value<std::string>(), "train on this token file (scripts/prepare_data.py) instead of synthetic data")
      ("data-order", po::value<DataOrder>()->default_value(DataOrder::Shuffled, "shuffled"),
       "shuffled (windows in a seeded order per epoch) | sequential (sample i of the run is window i)")
      ("validation-fraction", po::value<double>()->default_value(0.0), "share of the token file's windows held out for validation")
      ("eval-every", po::value<int64_t>()->default_value(0), "report the validation loss every N steps (0: never)")
      ("eval-batches", po::value<int64_t>()->default_value(4), "micro-batches of the validation split per evaluation")
      ("eval-only", po::bool_switch(), "report the validation loss of the starting weights (--resume's checkpoint, "
                                       "--init-from's or the seed's) and train nothing")
      ("optimizer", po::value<OptimizerKind>()->default_value(OptimizerKind::Sgd, "sgd"), "sgd (with momentum) | adam | adamw")
      ("lr", po::value<double>()->default_value(0.01), "learning rate (the schedule's peak)")
      ("momentum", po::value<double>()->default_value(0.9), "SGD momentum")
      ("weight-decay", po::value<double>()->default_value(0.0), "weight decay of matrices and embeddings (not of biases "
                                                                 "and norms): decoupled under adamw, L2 under sgd and adam")
      ("lr-schedule", po::value<LrScheduleKind>()->default_value(LrScheduleKind::Constant, "constant"),
       "constant | cosine | linear (decay to --min-lr at the last step), after --warmup-steps (transformers' schedules)")
      ("warmup-steps", po::value<int64_t>()->default_value(0), "steps of linear warmup from 0 to --lr")
      ("min-lr", po::value<double>()->default_value(0.0), "where cosine and linear decay end")
      ("grad-clip", po::value<double>()->default_value(0.0), "clip the global gradient norm (over every stage) to this before each "
                                                            "update, as clip_grad_norm_; 0: never (the norm is reported either way)")
      ("metrics-out", po::value<std::string>(), "append one JSON line per step and validation to this file (step, loss, lr, "
                                                "grad norm, samples/s and tokens/s, peak memory per stage); scripts/plot_metrics.py draws it");
  // clang-format on
  po::options_description options;
  options.add(own).add(common_options()).add(allocator_headroom_option()).add(model_override_options());
  return options;
}

// What the run does besides training on the graph, read and checked once before any work.
struct RunSettings {
  TrainConfig config;
  int64_t micro_batch_size = 0;
  int64_t capacity = 0;            // bytes per rank; 0: unlimited
  double allocator_headroom = -1;  // share of `capacity` a plan made here leaves free; < 0: the device's default
  int64_t eval_every = 0, eval_batches = 1;
  int64_t checkpoint_every = 0;
  bool resume = false, resume_override = false, quiet = false, in_process = false, eval_only = false;
  std::string checkpoint_dir, trace_path, save_path, metrics_path;
  std::string save_directory;  // --save-weights DIR: model.safetensors and (Hugging Face models) config.json
  std::string hf_config;       // that config.json's text; empty: not a Hugging Face export
  ThreadChoice threads;        // each rank's intra-op threads
  Progress::Style progress_style = Progress::Style::Auto;
  double samples_per_step = 0;
};

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
  check_grad_clip(vm["schedule"].as<ScheduleKind>(), config.optimizer.grad_clip);
  make_optimizer(config.optimizer, {});  // validates before any work
  config.data = data_config_from(vm);
  if (config.micro_batches < 1) throw ConfigError("--micro-batches must be at least 1");
  if (config.steps < 0) throw ConfigError("--steps must not be negative");
  return config;
}

RunSettings run_settings_from(const po::variables_map& vm, int replicas) {
  RunSettings s;
  s.config = train_config_from(vm);
  s.micro_batch_size = vm["micro-batch-size"].as<int64_t>();
  if (vm.count("device-memory")) s.capacity = parse_bytes(vm["device-memory"].as<std::string>(), "--device-memory");
  if (vm.count("allocator-headroom")) {
    if (s.capacity <= 0)
      throw ConfigError("--allocator-headroom is a share of the device memory: give --device-memory too");
    s.allocator_headroom = parse_allocator_headroom(vm["allocator-headroom"].as<std::string>());
  }
  s.eval_every = vm["eval-every"].as<int64_t>();
  s.eval_batches = vm["eval-batches"].as<int64_t>();
  if (s.eval_every < 0 || s.eval_batches < 1) throw ConfigError("--eval-every must be >= 0 and --eval-batches >= 1");
  s.eval_only = vm["eval-only"].as<bool>();
  if ((s.eval_every > 0 || s.eval_only) && !s.config.data.path.empty() && s.config.data.validation_fraction <= 0)
    throw ConfigError(std::string(s.eval_only ? "--eval-only" : "--eval-every") +
                      " needs a validation split: give --validation-fraction (e.g. 0.05)");
  if (s.eval_only && (s.eval_every > 0 || vm.count("checkpoint-every") && !vm["checkpoint-every"].defaulted() ||
                      vm.count("save-weights") || vm.count("trace")))
    throw ConfigError(
        "--eval-only trains nothing: leave out --eval-every, --checkpoint-every, --save-weights and --trace");
  s.quiet = vm["quiet"].as<bool>();
  s.progress_style = vm["progress"].as<Progress::Style>();
  s.samples_per_step = static_cast<double>(s.config.micro_batches * s.micro_batch_size * replicas);
  s.in_process = vm["in-process"].as<bool>();
  s.checkpoint_every = vm["checkpoint-every"].as<int64_t>();
  s.resume = vm["resume"].as<bool>();
  s.resume_override = vm["resume-override"].as<bool>();
  if (s.resume_override && !s.resume) throw ConfigError("--resume-override applies to --resume");
  if (vm.count("checkpoint-dir")) s.checkpoint_dir = vm["checkpoint-dir"].as<std::string>();
  if (s.checkpoint_every < 0) throw ConfigError("--checkpoint-every must not be negative");
  if ((s.checkpoint_every > 0 || s.resume) && s.checkpoint_dir.empty())
    throw ConfigError("--checkpoint-every and --resume need --checkpoint-dir DIR");
  if (vm.count("trace")) s.trace_path = vm["trace"].as<std::string>();
  if (vm.count("save-weights")) {  // a .safetensors file, or a directory for it and config.json
    const std::string given = vm["save-weights"].as<std::string>();
    const std::string suffix = ".safetensors";
    const bool file =
        given.size() > suffix.size() && given.compare(given.size() - suffix.size(), suffix.size(), suffix) == 0;
    s.save_directory = file ? "" : given;
    s.save_path = file ? given : given + "/model.safetensors";
  }
  if (vm.count("metrics-out")) s.metrics_path = vm["metrics-out"].as<std::string>();
  for (const char* input : {"init-from", "profile-in", "plan-in"})
    if (vm.count(input)) check_readable(vm[input].as<std::string>(), std::string("--") + input);
  if (vm.count("calibrate-trace"))
    for (const std::string& trace : vm["calibrate-trace"].as<std::vector<std::string>>())
      check_readable(trace, "--calibrate-trace");
  if (s.in_process && (!s.trace_path.empty() || s.checkpoint_every > 0 || s.resume))
    throw ConfigError("--trace, --checkpoint-every and --resume apply to MPI runs, not --in-process");
  if (s.in_process && !s.save_path.empty())
    throw ConfigError("--save-weights applies to MPI runs and one-stage runs, not --in-process");
  if (s.in_process && (s.eval_every > 0 || s.eval_only))
    throw ConfigError("--eval-every and --eval-only apply to MPI runs and one-stage runs, not --in-process");
  // Outputs: their directories are made now, and each must be writable before any work.
  const std::string plan_out = vm.count("plan-out") ? vm["plan-out"].as<std::string>() : "";
  for (const std::string& path : {s.trace_path, s.save_path, s.metrics_path, plan_out})
    if (!path.empty()) {
      if (const std::string dir = parent_directory(path); !dir.empty()) make_directories(dir);
      check_writable(path);
    }
  return s;
}

void print_threads(const ThreadChoice& t) { std::printf("  threads: %d per rank (%s)\n", t.threads, t.why.c_str()); }

// config.json for --save-weights DIR: the Hugging Face config a model file was exported from
// ("" for presets and other models), so that from_pretrained(DIR) loads the trained weights.
std::string hf_config_json(const ModelSource& source) {
  if (!source.imported()) return "";
  const Json& model = source.model_file().graph.at("model");
  if (!model.contains("hf_config")) return "";
  Json config = model.at("hf_config");
  if (model.contains("model_class")) config["architectures"] = Json::array({model.at("model_class")});
  return config.dump(2) + "\n";
}

// Rank 0, after the weights: config.json beside them (--save-weights DIR), and the line saying so.
void report_saved_weights(const RunSettings& s) {
  if (s.save_directory.empty() || s.hf_config.empty()) {
    std::printf("wrote weights %s\n", s.save_path.c_str());
    return;
  }
  write_text_atomically(s.save_directory + "/config.json", s.hf_config);
  std::printf("wrote weights %s and %s/config.json (transformers' from_pretrained(\"%s\") loads them)\n",
              s.save_path.c_str(), s.save_directory.c_str(), s.save_directory.c_str());
}

// "adamw lr 0.0003 (cosine after 100 warmup steps to 3e-05), weight decay 0.1, grad clip 1"
std::string optimizer_summary(const OptimizerConfig& o) {
  std::ostringstream out;
  out << optimizer_kind_name(o.kind) << " lr " << o.lr;
  const LrSchedule& sc = o.schedule;
  if (sc.kind != LrScheduleKind::Constant || sc.warmup_steps > 0) {
    out << " (" << sc.kind;
    if (sc.warmup_steps > 0) out << " after " << sc.warmup_steps << " warmup steps";
    if (sc.kind != LrScheduleKind::Constant) out << " to " << sc.min_lr;
    out << ")";
  }
  if (o.weight_decay > 0) out << ", weight decay " << o.weight_decay;
  if (o.grad_clip > 0) out << ", grad clip " << o.grad_clip;
  return out.str();
}

// A step's line of --metrics-out: what was reported, with the rates Progress measured.
StepMetrics step_metrics(int64_t step, double loss, double lr, double grad_norm, std::vector<int64_t> peaks,
                         const Progress& progress, const RunSettings& s, int64_t tokens_per_sample) {
  StepMetrics m;
  m.step = step;
  m.loss = loss;
  m.lr = lr;
  m.grad_norm = grad_norm;
  m.step_s = progress.last_step_seconds();
  m.samples_per_s = m.step_s > 0 ? s.samples_per_step / m.step_s : 0;
  m.tokens_per_s = m.samples_per_s * static_cast<double>(tokens_per_sample);
  m.peak_bytes = std::move(peaks);
  return m;
}

// The line a run stopped by a signal ends with, on rank 0: where its work is.
void print_stop(int signal, int64_t next_step, const RunSettings& s) {
  std::printf(
      "stopped by %s after step %" PRId64 " (exit %d): %s\n", stop_signal_name(signal), next_step - 1, 128 + signal,
      s.checkpoint_dir.empty() ? "no checkpoint written (give --checkpoint-dir DIR to keep a stopped run's work)"
                               : ("checkpoint " + s.checkpoint_dir + "/step-" + std::to_string(next_step) +
                                  " written; continue with the same command and --resume")
                                     .c_str());
}

// --eval-only's one line; `step`: the checkpoint's (steps trained).
void print_evaluation(double loss, const RunSettings& s, int64_t step) {
  std::printf("validation loss %.9g: the mean of %" PRId64 " micro-batches of the validation split, weights %s\n", loss,
              s.eval_batches,
              s.resume ? ("of the checkpoint at step " + std::to_string(step) + " in " + s.checkpoint_dir).c_str()
                       : "before any training");
}

// One stage, nothing the runtime alone does: the reference trainer.
int train_one_stage(const OpGraph& graph, const RunSettings& s) {
  CountingAllocator::install().set_capacity(s.capacity);
  ReferenceTrainer trainer(graph, s.config);
  MetricsLog metrics(s.metrics_path, false);
  if (!s.quiet)
    std::printf("training %s: %d nodes, %.2fM parameters, micro-batch %" PRId64 " x %" PRId64 ", %s, one stage\n",
                graph.preset.c_str(), graph.size(), graph.parameter_count() / 1e6, s.micro_batch_size,
                s.config.micro_batches, optimizer_summary(s.config.optimizer).c_str());
  if (!s.quiet) print_threads(s.threads);
  if (s.eval_only) {
    const double loss = trainer.evaluate(s.eval_batches);
    metrics.validation(-1, loss);  // after step -1: before any
    print_evaluation(loss, s, 0);
    return 0;
  }
  int64_t peak = 0;
  Progress progress(0, s.config.steps, s.samples_per_step, s.quiet, s.progress_style);
  const int64_t tokens = tokens_per_sample(graph);
  install_stop_handlers();
  int stopped_by = 0;
  for (int64_t step = 0; step < s.config.steps && !stopped_by; ++step) {
    const StepResult r = trainer.step();
    peak = std::max(peak, r.peak_bytes);
    progress.step(r.step, r.loss, r.lr, r.grad_norm);
    metrics.step(step_metrics(r.step, r.loss, r.lr, r.grad_norm, {r.peak_bytes}, progress, s, tokens));
    if (s.eval_every > 0 && (r.step + 1) % s.eval_every == 0) {
      const double loss = trainer.evaluate(s.eval_batches);
      progress.validation(r.step, loss);
      metrics.validation(r.step, loss);
    }
    if (step + 1 < s.config.steps) stopped_by = stop_signal();
  }
  progress.finish();
  std::printf("%s: %" PRId64
              " steps, final loss %.9g, %.1f samples/s after the first step (%.1f with it), peak memory %s\n",
              stopped_by ? "stopped" : "done", progress.steps_reported(), progress.last_loss(),
              progress.steady_samples_per_second(), progress.samples_per_second(),
              format_bytes(static_cast<double>(peak)).c_str());
  if (!s.save_path.empty()) {
    save_weights(trainer.module().parameters(), s.save_path, MPI_COMM_SELF);
    report_saved_weights(s);
  }
  if (!stopped_by) return 0;
  print_stop(stopped_by, progress.steps_reported(), s);
  return 128 + stopped_by;
}

// What a resumed run must repeat of the run that wrote its checkpoint (DIR/run.json), by option
// name: the model and data, and how it trains (--steps only where the schedule decays to the
// last step). Evaluation reads only the first part.
Json run_identity(const OpGraph& graph, const RunSettings& s, bool with_training) {
  Json j;
  j["model"] = graph.fingerprint();
  j["micro-batch-size"] = s.micro_batch_size;
  j["seed"] = s.config.seed;
  j["data"] = s.config.data.path;
  j["validation-fraction"] = s.config.data.validation_fraction;
  if (!with_training) return j;
  const OptimizerConfig& o = s.config.optimizer;
  j["micro-batches"] = s.config.micro_batches;
  j["data-order"] = s.config.data.sequential ? "sequential" : "shuffled";
  j["optimizer"] = optimizer_kind_name(o.kind);
  j["lr"] = o.lr;
  if (o.kind == OptimizerKind::Sgd) j["momentum"] = o.momentum;
  j["weight-decay"] = o.weight_decay;
  j["lr-schedule"] = lr_schedule_kind_name(o.schedule.kind);
  j["warmup-steps"] = o.schedule.warmup_steps;
  j["min-lr"] = o.schedule.min_lr;
  j["grad-clip"] = o.grad_clip;
  if (o.schedule.kind != LrScheduleKind::Constant) j["steps"] = s.config.steps;
  return j;
}

// Rank 0 of a resumed run: refuses settings that differ from the checkpoint's run, naming each,
// unless --resume-override (then says what changes). Checkpoints without run.json pass.
std::optional<Json> saved_run(const RunSettings& s) {
  const std::string path = s.checkpoint_dir + "/run.json";
  if (!std::ifstream(path).good()) return std::nullopt;
  return read_json(path, [&] { return Json::parse(read_text_file(path)); });
}

void check_resumed_run(const OpGraph& graph, const RunSettings& s) {
  const std::optional<Json> found = saved_run(s);
  if (!found) return;
  const Json& saved = *found;
  const Json now = run_identity(graph, s, !s.eval_only);
  std::string changes;
  for (const auto& [key, value] : now.items())
    if (saved.contains(key) && saved[key] != value)
      changes += (changes.empty() ? "--" : ", --") + key + " " + saved[key].dump() + " -> " + value.dump();
  if (changes.empty()) return;
  if (!s.resume_override)
    throw ConfigError("--resume continues the run in " + s.checkpoint_dir + ", and this one changes " + changes +
                      ": repeat its values, or give --resume-override to change them");
  std::printf("  note: --resume-override: %s\n", changes.c_str());
}

// A plan given with --plan-in: its text (every rank has it) and what it says.
struct GivenPlan {
  std::string json;
  Plan plan;
};

// The plan every rank runs: the given one, or rank 0's (a resumed run's saved one, or planned
// here) broadcast; checked against this run.
Plan agreed_plan(const po::variables_map& vm, const std::optional<GivenPlan>& given, const OpGraph& graph,
                 const RankLayout& layout, const RunSettings& s, c10::Device device, int rank) {
  if (vm.count("plan-out")) check_writable(vm["plan-out"].as<std::string>());
  const std::string saved_plan = s.checkpoint_dir.empty() ? "" : s.checkpoint_dir + "/plan.json";
  std::string plan_json;
  if (given) {
    plan_json = given->json;
  } else {
    // A resumed run keeps the split its checkpoint was written with.
    if (rank == 0) {
      const bool keep_saved = s.resume && std::ifstream(saved_plan).good();
      if (keep_saved && vm.count("calibrate-trace"))
        throw ConfigError("--calibrate-trace plans anew, and a resumed run keeps its checkpoint's plan (" + saved_plan +
                          ")");
      plan_json = keep_saved ? read_text_file(saved_plan)
                             : plan_on_rank0(vm, graph, layout.stages, layout.replicas, s.capacity,
                                             s.allocator_headroom >= 0 ? s.allocator_headroom
                                                                       : default_allocator_headroom(device.str()),
                                             device);
    }
    broadcast_string_quietly(plan_json, 0, MPI_COMM_WORLD);  // the others wait while rank 0 plans
  }
  if (rank == 0 && !s.checkpoint_dir.empty() && !s.eval_only) {  // what a resumed run needs besides the weights
    make_directories(s.checkpoint_dir);
    write_text_atomically(saved_plan, plan_json);
    write_text_atomically(s.checkpoint_dir + "/run.json", run_identity(graph, s, true).dump(2) + "\n");
  }
  Plan plan = plan_from_json(plan_json);
  if (plan.precision != graph.precision)
    throw ConfigError("the plan was made for " + plan.precision + ", this run trains in " + graph.precision +
                      " (plan again from a " + graph.precision + " profile)");
  if (static_cast<int>(plan.stages.size()) != layout.stages)
    throw ConfigError("the plan has " + std::to_string(plan.stages.size()) + " stages, but " +
                      std::to_string(layout.stages) + " are launched");
  if (rank == 0 && vm.count("plan-out")) write_text_atomically(vm["plan-out"].as<std::string>(), plan_json);
  return plan;
}

PipelineConfig pipeline_config(const Plan& plan, const po::variables_map& vm, const OpGraph& graph,
                               const RankLayout& layout, const RunSettings& s, c10::Device device, int64_t first_step) {
  PipelineConfig pc = pipeline_config_of(plan, graph);
  pc.schedule = vm["schedule"].as<ScheduleKind>();
  pc.micro_batches = s.config.micro_batches;
  pc.steps = s.config.steps;
  pc.seed = s.config.seed;
  pc.optimizer = s.config.optimizer;
  pc.device = device;
  pc.data = s.config.data;
  pc.replica = layout.replica;
  pc.replicas = layout.replicas;
  pc.first_step = first_step;
  // The asynchronous pipeline drains where it writes a checkpoint and where it evaluates
  // (PipelineConfig::drain_every).
  if (pc.schedule == ScheduleKind::Async) {
    pc.drain_every = s.checkpoint_every;
    if (s.eval_every > 0 && pc.drain_every == 0) pc.drain_every = s.eval_every;
    if (s.eval_every > 0 && s.eval_every % pc.drain_every != 0)
      throw ConfigError(
          "under --schedule async, --eval-every must be a multiple of --checkpoint-every (the pipeline "
          "drains there)");
  }
  return pc;
}

// ", swaps 1.5 MiB and recomputes 512 KiB of each micro-batch's activations (+0.4 ms, 6%)" where the
// plan evicts on the stage.
std::string memopt_summary(const StagePlan& stage) {
  int64_t swapped = 0, recomputed = 0;
  for (const TensorDecision& d : stage.decisions) {
    if (d.action == TensorAction::Swap) swapped += d.bytes;
    if (d.action == TensorAction::Recompute) recomputed += d.bytes;
  }
  if (swapped == 0 && recomputed == 0) return "";
  std::string what;
  if (swapped > 0) what += "swaps " + format_bytes(static_cast<double>(swapped));
  if (recomputed > 0)
    what += (what.empty() ? "recomputes " : " and recomputes ") + format_bytes(static_cast<double>(recomputed));
  char overhead[64];
  std::snprintf(overhead, sizeof overhead, " (+%.2f ms, %.0f%%)", stage.memopt_ms,
                stage.compute_ms > 0 ? 100 * stage.memopt_ms / stage.compute_ms : 0.0);
  return ", " + what + " of each micro-batch's activations" + overhead;
}

void print_run_header(const OpGraph& graph, const Plan& plan, const PipelineConfig& pc, const RankLayout& layout,
                      const RunSettings& s) {
  std::printf("training %s: %d nodes, %.2fM parameters, micro-batch %" PRId64 " x %" PRId64 ", %s, %d stage%s, %s%s\n",
              graph.preset.c_str(), graph.size(), graph.parameter_count() / 1e6, s.micro_batch_size, pc.micro_batches,
              optimizer_summary(pc.optimizer).c_str(), layout.stages, layout.stages == 1 ? "" : "s",
              schedule_kind_name(pc.schedule),
              layout.replicas > 1 ? (", " + std::to_string(layout.replicas) + " data-parallel replicas on " +
                                     std::to_string(layout.nodes) + (layout.nodes == 1 ? " host" : " hosts"))
                                        .c_str()
                                  : "");
  print_threads(s.threads);
  if (!layout.pipelines_within_nodes)
    std::printf(
        "  warning: some host runs a number of ranks that is no multiple of %d stages, so some pipelines "
        "span hosts and send their activations between them\n",
        layout.stages);
  if (plan.options.allocator_headroom_bytes > 0)
    std::printf("  memory: planned within %s per rank, leaving %s of --device-memory to the allocator\n",
                format_bytes(static_cast<double>(plan.options.capacity_bytes)).c_str(),
                format_bytes(static_cast<double>(plan.options.allocator_headroom_bytes)).c_str());
  for (const StagePlan& stage : plan.stages)
    std::printf("  stage %d: nodes [%d, %d), predicted peak %s%s\n", stage.index, stage.begin, stage.end,
                format_bytes(static_cast<double>(stage.memory.predicted_peak())).c_str(),
                memopt_summary(stage).c_str());
  if (pc.schedule == ScheduleKind::Async)
    for (const auto& [holders, names] : tied_across_stages(graph, pc)) {
      std::string stages;
      for (int h : holders) stages += (stages.empty() ? "" : h == holders.back() ? " and " : ", ") + std::to_string(h);
      const std::string more = names.size() > 1 ? " and " + std::to_string(names.size() - 1) + " more are" : " is";
      std::printf(
          "  note: %s%s tied across stages %s; under async each stage updates its own copy with its own "
          "gradients (the copies drift apart; gpipe and 1f1b sum them)\n",
          names.front().c_str(), more.c_str(), stages.c_str());
    }
  for (const StagePlan& stage : plan.stages)
    if (s.capacity > 0 && stage.memory.predicted_peak() > s.capacity)
      std::printf(
          "  warning: stage %d is predicted to peak at %s, above --device-memory; the planner's search "
          "model under-estimated it: expect an out-of-memory error\n",
          stage.index, format_bytes(static_cast<double>(stage.memory.predicted_peak())).c_str());
}

// Runs this rank's share: every stage in this process, or its own stage, on its replica's
// pipeline communicator (each stage's replicas share another).
StageRun run_this_rank(const OpGraph& graph, const PipelineConfig& pc, const RankLayout& layout, RunOptions& run,
                       bool in_process) {
  if (in_process) {
    run_pipeline_in_process(graph, pc, run.on_loss);
    StageRun mine;
    mine.peak_bytes = DeviceMemory::peak_bytes(pc.device);
    mine.reserved_peak_bytes = DeviceMemory::reserved_peak_bytes(pc.device);
    mine.next_step = pc.steps;
    return mine;
  }
  MPI_Comm pipeline = MPI_COMM_WORLD;
  if (layout.replicas > 1) {
    MPI_Comm_split(MPI_COMM_WORLD, layout.replica, layout.stage, &pipeline);
    MPI_Comm_split(MPI_COMM_WORLD, layout.stage, layout.replica, &run.replica_comm);
  }
  StageRun mine = run_pipeline_mpi(graph, pc, pipeline, run);
  mine.reserved_peak_bytes = DeviceMemory::reserved_peak_bytes(pc.device);
  if (layout.replicas > 1) MPI_Comm_free(&pipeline), MPI_Comm_free(&run.replica_comm);
  return mine;
}

// Rank 0: measured peaks next to the plan's predictions, the transport, throughput.
void print_run_report(const Plan& plan, const PipelineConfig& pc, const RankLayout& layout, const RunSettings& s,
                      const StageRun& mine, const MpiWorld& world, const Progress& progress, double seconds) {
  const std::vector<RankPeak> peaks = gather_peaks(mine, layout, MPI_COMM_WORLD);
  if (world.rank != 0) return;
  if (!s.in_process && !s.quiet)
    std::printf("  transport: %s on %s\n", mine.transport.c_str(), pc.device.is_cuda() ? "cuda" : "cpu");
  if (!s.in_process)
    for (const RankPeak& r : peaks)
      std::printf("  stage %d%s: measured peak %s (predicted %s)%s\n", r.stage,
                  layout.replicas > 1 ? (" of replica " + std::to_string(r.replica)).c_str() : "",
                  format_bytes(double(r.peak_bytes)).c_str(),
                  format_bytes(double(plan.stages[static_cast<size_t>(r.stage)].memory.predicted_peak())).c_str(),
                  pc.device.is_cuda()
                      ? (", the caching allocator held up to " + format_bytes(double(r.reserved_peak_bytes))).c_str()
                      : "");
  const double trained = static_cast<double>(mine.next_step - pc.first_step);
  // Steady state first: the first step pays for the pipeline fill and first allocations.
  std::printf("%s: %" PRId64 " steps, final loss %.9g, %.1f samples/s after the first step (%.1f with it)\n",
              mine.stop_signal ? "stopped" : "done", mine.next_step, progress.last_loss(),
              progress.steady_samples_per_second(), seconds > 0 ? s.samples_per_step * trained / seconds : 0.0);
  if (!s.save_path.empty()) report_saved_weights(s);
  if (!s.trace_path.empty())
    std::printf("wrote trace %s (dawnpiper inspect %s)\n", s.trace_path.c_str(), s.trace_path.c_str());
}

// What the runtime does besides training, from the run's settings (callbacks left to the caller).
RunOptions run_options_from(const RunSettings& s, const OpGraph& graph, TransportChoice transport) {
  RunOptions run;
  run.transport = transport;
  run.trace = !s.trace_path.empty();
  run.checkpoint_every = s.checkpoint_every;
  run.resume = s.resume;
  run.checkpoint_dir = s.checkpoint_dir;
  run.preset = graph.preset;
  run.eval_every = s.eval_every;
  run.eval_batches = s.eval_batches;
  return run;
}

// --eval-only on the pipeline: the checkpoint's (or the initial) weights, one validation.
int evaluate_pipeline(const po::variables_map& vm, const std::optional<GivenPlan>& given, const OpGraph& graph,
                      const RankLayout& layout, const RunSettings& s, const MpiWorld& world, c10::Device device,
                      TransportChoice transport, int64_t first_step) {
  const Plan plan = agreed_plan(vm, given, graph, layout, s, device, world.rank);
  const PipelineConfig pc = pipeline_config(plan, vm, graph, layout, s, device, first_step);
  RunOptions run = run_options_from(s, graph, transport);
  run.eval_only = true;
  MetricsLog metrics(world.rank == 0 ? s.metrics_path : "", s.resume);
  run.on_validation = [&](const StepReport& r) {
    if (world.rank != 0) return;
    metrics.validation(r.step, r.loss);
    print_evaluation(r.loss, s, r.step + 1);
  };
  run_this_rank(graph, pc, layout, run, false);
  return 0;
}

int train_pipeline(const po::variables_map& vm, const std::optional<GivenPlan>& given, const OpGraph& graph,
                   const RankLayout& layout, const RunSettings& s, const MpiWorld& world, c10::Device device,
                   TransportChoice transport) {
  int64_t first_step = 0;
  if (s.resume) {
    first_step = latest_checkpoint(s.checkpoint_dir);
    if (first_step > s.config.steps)
      throw ConfigError("the checkpoint is at step " + std::to_string(first_step) + ", beyond --steps " +
                        std::to_string(s.config.steps));
    if (first_step == s.config.steps && !s.eval_only) {
      if (world.rank == 0)
        std::printf("nothing to do: the checkpoint in %s is at step %" PRId64
                    ", the run's last (--steps); raise --steps to train on\n",
                    s.checkpoint_dir.c_str(), first_step);
      return 0;
    }
    if (world.rank == 0) check_resumed_run(graph, s);
    if (world.rank == 0 && !s.quiet)
      std::printf("resuming from the checkpoint at step %" PRId64 " in %s\n", first_step, s.checkpoint_dir.c_str());
  }
  if (s.eval_only) {  // trains nothing: the run ends where it starts
    RunSettings evaluation = s;
    evaluation.config.steps = first_step;
    // The checkpoint holds its optimizer's state: the stages are built with that optimizer.
    if (const std::optional<Json> saved = s.resume ? saved_run(s) : std::nullopt; saved && saved->contains("optimizer"))
      evaluation.config.optimizer.kind = optimizer_kind_from_name((*saved)["optimizer"].get<std::string>());
    return evaluate_pipeline(vm, given, graph, layout, evaluation, world, device, transport, first_step);
  }
  const Plan plan = agreed_plan(vm, given, graph, layout, s, device, world.rank);
  const PipelineConfig pc = pipeline_config(plan, vm, graph, layout, s, device, first_step);
  DeviceMemory::set_capacity(device, s.capacity);
  if (world.rank == 0 && !s.quiet) print_run_header(graph, plan, pc, layout, s);
  DeviceMemory::reset_peak(device);
  RunOptions run = run_options_from(s, graph, transport);
  // Async can stop only where it drains (at checkpoints); without them a signal ends it at once.
  run.stop_on_signal = !s.in_process && (pc.schedule != ScheduleKind::Async || pc.drain_every > 0);
  if (run.stop_on_signal) install_stop_handlers();
  Progress progress(pc.first_step, pc.steps, s.samples_per_step, s.quiet || world.rank != 0, s.progress_style);
  MetricsLog metrics(world.rank == 0 ? s.metrics_path : "", s.resume);
  const int64_t tokens = tokens_per_sample(graph);
  run.on_loss = [&](const StepReport& r) {
    progress.step(r.step, r.loss, r.lr, r.grad_norm);
    if (world.rank == 0)
      metrics.step(step_metrics(r.step, r.loss, r.lr, r.grad_norm, r.peak_bytes, progress, s, tokens));
  };
  run.on_validation = [&](const StepReport& r) {
    progress.validation(r.step, r.loss);
    if (world.rank == 0) metrics.validation(r.step, r.loss);
  };
  const auto start = std::chrono::steady_clock::now();
  const StageRun mine = run_this_rank(graph, pc, layout, run, s.in_process);
  synchronize(device);  // the clock stops when the device has finished this rank's work
  progress.finish();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (run.trace) write_pipeline_trace(graph, plan, pc, layout, mine, MPI_COMM_WORLD, s.trace_path);
  if (!s.save_path.empty()) {  // replica 0's stages in stage order (the replicas hold the same weights)
    MPI_Comm first_replica;
    MPI_Comm_split(MPI_COMM_WORLD, layout.replica == 0 ? 0 : MPI_UNDEFINED, layout.stage, &first_replica);
    if (first_replica != MPI_COMM_NULL)
      save_weights(mine.parameters, s.save_path, first_replica), MPI_Comm_free(&first_replica);
  }
  print_run_report(plan, pc, layout, s, mine, world, progress, seconds);
  if (!mine.stop_signal) return 0;
  if (world.rank == 0) print_stop(mine.stop_signal, mine.next_step, s);
  return 128 + mine.stop_signal;
}

// The plan given with --plan-in (read on rank 0, broadcast), its settings adopted into vm.
std::optional<GivenPlan> given_plan(po::variables_map& vm, const MpiWorld& world) {
  if (!vm.count("plan-in")) return std::nullopt;
  if (vm.count("calibrate-trace"))
    throw ConfigError(
        "--calibrate-trace corrects the profile a plan is made from; --plan-in gives the plan (make it "
        "with `dawnpiper plan --calibrate-trace`)");
  GivenPlan given;
  if (world.rank == 0) given.json = read_text_file(vm["plan-in"].as<std::string>());
  broadcast_string_quietly(given.json, 0, MPI_COMM_WORLD);
  given.plan = plan_from_json(given.json);
  adopt_plan_settings(given.plan, vm);
  return given;
}

}  // namespace

int cmd_train(int argc, char** argv, const MpiWorld& world) {
  po::variables_map vm;
  if (!parse_options(argc, argv, "train",
                     "Trains a model: one stage with the reference trainer, several as a pipeline.", train_options(),
                     vm))
    return 0;
  // A given plan decides how the run trains; flags and config values may only repeat it.
  const std::optional<GivenPlan> given = given_plan(vm, world);
  const Plan* plan = given ? &given->plan : nullptr;
  const bool in_process = vm["in-process"].as<bool>();
  const RankLayout layout = layout_from(vm, world, in_process);
  RunSettings settings = run_settings_from(vm, layout.replicas);
  const TransportChoice transport = vm["transport"].as<TransportChoice>();
  // Each rank's own GPU (node-local rank round robin over the visible ones) with --device cuda.
  const c10::Device device =
      rank_device(parse_device(vm["device"].as<std::string>(), /*require_gpu=*/false), MPI_COMM_WORLD);
  check_transport_choice(transport, device);
  if (vm["threads"].as<int>() < 0) throw ConfigError("--threads must be positive (0: choose)");
  settings.threads = choose_threads(vm["threads"].as<int>(), MPI_COMM_WORLD);
  CountingAllocator::install();
  const ModelSource source = model_source_from(vm);
  const OpGraph graph = source.graph(settings.micro_batch_size);
  settings.hf_config = hf_config_json(source);
  if (plan && !plan->graph_hash.empty() && plan->graph_hash != graph.fingerprint())
    throw ConfigError("the plan (--plan-in) was made for another graph: " + plan->preset + " with " +
                      std::to_string(plan->nodes) + " nodes, fingerprint " + plan->graph_hash + "; this run's " +
                      graph.preset + " has " + std::to_string(graph.size()) + " nodes, fingerprint " +
                      graph.fingerprint());
  // The reference trainer serves plain one-stage runs; traces, checkpoints and planned memory
  // optimization need the runtime.
  const bool runtime_features = !settings.trace_path.empty() || settings.checkpoint_every > 0 || settings.resume ||
                                vm["memopt"].as<MemoptMode>() != MemoptMode::None || plan || device.is_cuda();
  if (vm.count("calibrate-trace") && layout.stages == 1)
    throw ConfigError("--calibrate-trace corrects the stages of a pipeline; this run has one stage");
  if (layout.stages == 1 && layout.replicas == 1 && !in_process && !runtime_features)
    return train_one_stage(graph, settings);
  return train_pipeline(vm, given, graph, layout, settings, world, device, transport);
}

}  // namespace dawnpiper
