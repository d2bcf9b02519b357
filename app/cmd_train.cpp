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
#include "plan/memory_optimizer.h"
#include "plan/planner.h"
#include "profile/profile_cache.h"
#include "profile/profile_io.h"
#include "profile/profiler.h"
#include "runtime/pipeline.h"
#include "train/reference_trainer.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/files.h"
#include "util/progress.h"
#include "util/units.h"
#include "trace/trace.h"
#include "runtime/checkpoint.h"
#include "runtime/device_placement.h"
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

// Rank 0: the plan (loaded, or made from a loaded or freshly measured profile) as JSON.
std::string plan_on_rank0(const po::variables_map& vm, const OpGraph& graph, int stages, int replicas, int64_t capacity,
                          c10::Device device) {
  if (vm.count("plan-in")) return read_text_file(vm["plan-in"].as<std::string>());
  Profile profile;
  if (vm.count("profile-in")) {
    profile = read_profile(vm["profile-in"].as<std::string>());
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
  PlanOptions o;
  o.stages = stages;
  o.schedule = vm["schedule"].as<ScheduleKind>();
  o.micro_batches = vm["micro-batches"].as<int64_t>();
  o.optimizer = vm["optimizer"].as<OptimizerKind>();
  o.capacity_bytes = capacity > 0 ? capacity : INT64_MAX;
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
  const std::string order = vm["data-order"].as<std::string>();
  if (order != "shuffled" && order != "sequential")
    throw ConfigError("--data-order '" + order + "': expected shuffled or sequential");
  d.sequential = order == "sequential";
  d.validation_fraction = vm["validation-fraction"].as<double>();
  if (d.validation_fraction < 0 || d.validation_fraction >= 1)
    throw ConfigError("--validation-fraction must be in [0, 1)");
  if (d.path.empty() && (!vm["data-order"].defaulted() || d.validation_fraction > 0))
    throw ConfigError("--data-order and --validation-fraction apply to --data (a token file)");
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

// Data x pipeline parallelism: world = replicas x stages. A pipeline's stages exchange activations
// every micro-batch, its replicas only gradients once a step, so a pipeline is kept on one node:
// ranks are ordered by node (the ranks MPI says share memory), then by rank, and consecutive
// ranks in that order form a pipeline. Under block placement this is the plain rank order.
struct Layout {
  int stages = 1, replicas = 1;
  int replica = 0, stage = 0;  // this rank's
  int nodes = 1;
  bool pipelines_within_nodes = true;  // false when a node's rank count is no multiple of stages
};

void order_ranks_by_node(const MpiWorld& world, Layout& l) {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world.rank, MPI_INFO_NULL, &node);
  int leader = world.rank;  // the node's lowest world rank names the node
  MPI_Bcast(&leader, 1, MPI_INT, 0, node);
  MPI_Comm_free(&node);
  std::vector<int> leaders(static_cast<size_t>(world.size));
  MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::vector<int> order(static_cast<size_t>(world.size));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return leaders[a] < leaders[b]; });
  const int position = static_cast<int>(std::find(order.begin(), order.end(), world.rank) - order.begin());
  l.replica = position / l.stages;
  l.stage = position % l.stages;
  std::map<int, int> ranks_per_node;
  for (int n : leaders) ++ranks_per_node[n];
  l.nodes = static_cast<int>(ranks_per_node.size());
  for (const auto& [n, count] : ranks_per_node) l.pipelines_within_nodes &= count % l.stages == 0;
}

Layout data_pipeline_layout(const po::variables_map& vm, const MpiWorld& world, bool in_process) {
  Layout l;
  const int dp = vm.count("data-parallel") ? vm["data-parallel"].as<int>() : 0;
  if (vm.count("data-parallel") && dp < 1) throw ConfigError("--data-parallel must be at least 1");
  if (in_process) {
    if (world.size != 1) throw ConfigError("--in-process runs every stage in one process: launch one rank");
    if (dp > 1) throw ConfigError("--data-parallel needs MPI ranks, not --in-process");
    l.stages = vm.count("stages") ? vm["stages"].as<int>() : 1;
    if (l.stages < 1) throw ConfigError("--stages must be at least 1");
    return l;
  }
  l.stages = vm.count("stages") ? vm["stages"].as<int>() : (dp > 0 ? world.size / dp : world.size);
  if (l.stages < 1 || (vm.count("stages") && vm["stages"].as<int>() < 1))
    throw ConfigError("--stages must be at least 1");
  if (dp > 0 && dp * l.stages != world.size)
    throw ConfigError("--data-parallel " + std::to_string(dp) + " x " + std::to_string(l.stages) + " stages needs " +
                      std::to_string(dp * l.stages) + " MPI ranks, but " + std::to_string(world.size) +
                      " are launched");
  if (world.size % l.stages != 0)
    throw ConfigError("--stages " + std::to_string(l.stages) + " but " + std::to_string(world.size) +
                      " MPI ranks: launch with `mpirun -np " + std::to_string(l.stages) +
                      "` (or a multiple of it for data parallelism, or use --in-process)");
  l.replicas = world.size / l.stages;
  order_ranks_by_node(world, l);
  return l;
}

void broadcast(std::string& text) {
  int64_t n = static_cast<int64_t>(text.size());
  MPI_Bcast(&n, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  text.resize(static_cast<size_t>(n));
  MPI_Bcast(text.data(), static_cast<int>(n), MPI_CHAR, 0, MPI_COMM_WORLD);
}

}  // namespace

int cmd_train(int argc, char** argv, const MpiWorld& world) {
  po::options_description options;
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
      ("profile-cache", po::value<std::string>()->default_value(""),
       "where measured profiles are kept and reused: a directory, or off (default: $DAWNPIPER_CACHE, else "
       "$XDG_CACHE_HOME/dawnpiper or ~/.cache/dawnpiper)")
      ("plan-out", po::value<std::string>(), "write the plan used to this file")
      ("transport", po::value<std::string>()->default_value("auto"),
       "auto | mpi (CPU tensors) | nccl (CUDA, ranks on different GPUs) | host (CUDA through host memory over MPI; "
       "what auto takes between ranks sharing a GPU)")
      ("in-process", po::bool_switch(), "run every stage in this one process (validates a plan without MPI)")
      ("trace", po::value<std::string>(), "write an HDF5 trace of every action on every rank (docs/trace-format.md)")
      ("checkpoint-dir", po::value<std::string>(), "directory for checkpoints (every stage's parameters and optimizer state)")
      ("checkpoint-every", po::value<int64_t>()->default_value(0), "write a checkpoint every K steps (and after the last)")
      ("save-weights", po::value<std::string>(), "after training, write the weights to this safetensors file (PyTorch names: "
                                                 "transformers' from_pretrained loads it)")
      ("progress", po::value<std::string>()->default_value("auto"),
       "auto (a bar on a terminal, lines in logs and under mpirun) | bar | lines")
      ("resume", po::bool_switch(), "continue from the latest checkpoint in --checkpoint-dir")
      ("steps", po::value<int64_t>()->default_value(10), "training steps")
      ("data", po::value<std::string>(), "train on this token file (scripts/prepare_data.py) instead of synthetic data")
      ("data-order", po::value<std::string>()->default_value("shuffled"),
       "shuffled (windows in a seeded order per epoch) | sequential (sample i of the run is window i)")
      ("validation-fraction", po::value<double>()->default_value(0.0), "share of the token file's windows held out for validation")
      ("eval-every", po::value<int64_t>()->default_value(0), "report the validation loss every N steps (0: never)")
      ("eval-batches", po::value<int64_t>()->default_value(4), "micro-batches of the validation split per evaluation")
      ("optimizer", po::value<OptimizerKind>()->default_value(OptimizerKind::Sgd, "sgd"), "sgd (with momentum) | adam")
      ("lr", po::value<double>()->default_value(0.01), "learning rate")
      ("momentum", po::value<double>()->default_value(0.9), "SGD momentum");
  // clang-format on
  options.add(own).add(common_options()).add(model_override_options());
  po::variables_map vm;
  if (!parse_options(argc, argv, "train",
                     "Trains a model: one stage with the reference trainer, several as a pipeline.", options, vm))
    return 0;
  // A given plan decides how the run trains; flags and config values may only repeat it.
  std::optional<Plan> given_plan;
  if (vm.count("plan-in")) {
    std::string text;
    if (world.rank == 0) text = read_text_file(vm["plan-in"].as<std::string>());
    broadcast(text);
    given_plan = plan_from_json(text);
    adopt_plan_settings(*given_plan, vm);
  }
  const bool in_process = vm["in-process"].as<bool>();
  const Layout layout = data_pipeline_layout(vm, world, in_process);
  const int stages = layout.stages, replicas = layout.replicas;
  const TransportChoice transport = transport_choice_from_name(vm["transport"].as<std::string>());
  // Each rank's own GPU (node-local rank round robin over the visible ones) with --device cuda.
  const c10::Device device = rank_device(parse_device(vm["device"].as<std::string>()), MPI_COMM_WORLD);
  check_transport_choice(transport, device);
  CountingAllocator& counter = CountingAllocator::install();
  int64_t capacity = 0;
  if (vm.count("device-memory")) capacity = parse_bytes(vm["device-memory"].as<std::string>(), "--device-memory");

  const ModelSource model = model_source_from(vm);
  const int64_t micro_batch_size = vm["micro-batch-size"].as<int64_t>();
  OpGraph graph = model.graph(micro_batch_size);
  if (given_plan && !given_plan->graph_hash.empty() && given_plan->graph_hash != graph.fingerprint())
    throw ConfigError("the plan (--plan-in) was made for another graph: " + given_plan->preset + " with " +
                      std::to_string(given_plan->nodes) + " nodes, fingerprint " + given_plan->graph_hash +
                      "; this run's " + graph.preset + " has " + std::to_string(graph.size()) + " nodes, fingerprint " +
                      graph.fingerprint());
  TrainConfig config;
  config.steps = vm["steps"].as<int64_t>();
  config.micro_batches = vm["micro-batches"].as<int64_t>();
  config.seed = vm["seed"].as<uint64_t>();
  config.optimizer.kind = vm["optimizer"].as<OptimizerKind>();
  config.optimizer.lr = vm["lr"].as<double>();
  config.optimizer.momentum = vm["momentum"].as<double>();
  make_optimizer(config.optimizer, {});  // validates before any work
  config.data = data_config_from(vm);
  const int64_t eval_every = vm["eval-every"].as<int64_t>(), eval_batches = vm["eval-batches"].as<int64_t>();
  if (eval_every < 0 || eval_batches < 1) throw ConfigError("--eval-every must be >= 0 and --eval-batches >= 1");
  if (eval_every > 0 && !config.data.path.empty() && config.data.validation_fraction <= 0)
    throw ConfigError("--eval-every needs a validation split: give --validation-fraction (e.g. 0.05)");
  if (config.micro_batches < 1) throw ConfigError("--micro-batches must be at least 1");
  if (config.steps < 0) throw ConfigError("--steps must not be negative");
  const bool quiet = vm["quiet"].as<bool>();
  const Progress::Style progress_style = Progress::style_from_name(vm["progress"].as<std::string>());
  const double samples_per_step = static_cast<double>(config.micro_batches * micro_batch_size * replicas);

  const int64_t checkpoint_every = vm["checkpoint-every"].as<int64_t>();
  const bool resume = vm["resume"].as<bool>();
  if (checkpoint_every < 0) throw ConfigError("--checkpoint-every must not be negative");
  if ((checkpoint_every > 0 || resume) && !vm.count("checkpoint-dir"))
    throw ConfigError("--checkpoint-every and --resume need --checkpoint-dir DIR");
  if (in_process && (vm.count("trace") || checkpoint_every > 0 || resume))
    throw ConfigError("--trace, --checkpoint-every and --resume apply to MPI runs, not --in-process");
  if (vm.count("trace")) check_writable(vm["trace"].as<std::string>());
  const std::string save_path = vm.count("save-weights") ? vm["save-weights"].as<std::string>() : "";
  if (!save_path.empty()) check_writable(save_path);
  if (!save_path.empty() && in_process)
    throw ConfigError("--save-weights applies to MPI runs and one-stage runs, not --in-process");
  // The reference trainer serves plain one-stage runs; traces, checkpoints and planned memory
  // optimization need the runtime.
  const bool runtime_features = vm.count("trace") || checkpoint_every > 0 || resume ||
                                vm["memopt"].as<MemoptMode>() != MemoptMode::None || vm.count("plan-in") ||
                                device.is_cuda();
  if (stages == 1 && replicas == 1 && !in_process && !runtime_features) {
    counter.set_capacity(capacity);
    ReferenceTrainer trainer(graph, config);
    if (!quiet)
      std::printf("training %s: %d nodes, %.2fM parameters, micro-batch %" PRId64 " x %" PRId64 ", %s lr %g, 1 stage\n",
                  graph.preset.c_str(), graph.size(), graph.parameter_count() / 1e6, micro_batch_size,
                  config.micro_batches, optimizer_kind_name(config.optimizer.kind), config.optimizer.lr);
    int64_t peak = 0;
    Progress progress(0, config.steps, samples_per_step, quiet, progress_style);
    trainer.run([&](const StepResult& r) {
      peak = std::max(peak, r.peak_bytes);
      progress.step(r.step, r.loss);
      if (eval_every > 0 && (r.step + 1) % eval_every == 0) progress.validation(r.step, trainer.evaluate(eval_batches));
    });
    progress.finish();
    std::printf("done: %" PRId64
                " steps, final loss %.9g, %.1f samples/s after the first step (%.1f with it), "
                "peak memory %s\n",
                config.steps, progress.last_loss(), progress.steady_samples_per_second(), progress.samples_per_second(),
                format_bytes(static_cast<double>(peak)).c_str());
    if (!save_path.empty()) {
      save_weights(trainer.module().parameters(), save_path, MPI_COMM_SELF);
      std::printf("wrote weights %s\n", save_path.c_str());
    }
    return 0;
  }

  // --- pipeline: plan on rank 0, broadcast, one stage per rank ---
  std::string plan_json;
  if (vm.count("plan-out")) check_writable(vm["plan-out"].as<std::string>());
  int64_t first_step = 0;
  if (resume) {
    first_step = latest_checkpoint(vm["checkpoint-dir"].as<std::string>());
    if (first_step > config.steps)
      throw ConfigError("the checkpoint is at step " + std::to_string(first_step) + ", beyond --steps " +
                        std::to_string(config.steps));
  }
  // A resumed run keeps the split its checkpoint was written with.
  const std::string saved_plan =
      vm.count("checkpoint-dir") ? vm["checkpoint-dir"].as<std::string>() + "/plan.json" : "";
  if (world.rank == 0) {
    if (resume && !vm.count("plan-in") && std::ifstream(saved_plan).good())
      plan_json = read_text_file(saved_plan);
    else
      plan_json = plan_on_rank0(vm, graph, stages, replicas, capacity, device);
    if (checkpoint_every > 0) {
      make_directories(vm["checkpoint-dir"].as<std::string>());
      write_text_atomically(saved_plan, plan_json);
    }
  }
  broadcast(plan_json);
  Plan plan = plan_from_json(plan_json);
  if (plan.precision != graph.precision)
    throw ConfigError("the plan was made for " + plan.precision + ", this run trains in " + graph.precision +
                      " (plan again from a " + graph.precision + " profile)");
  if (static_cast<int>(plan.stages.size()) != stages)
    throw ConfigError("the plan has " + std::to_string(plan.stages.size()) + " stages, but " + std::to_string(stages) +
                      " are launched");
  if (world.rank == 0 && vm.count("plan-out")) write_text_atomically(vm["plan-out"].as<std::string>(), plan_json);
  PipelineConfig pc;
  pc.schedule = vm["schedule"].as<ScheduleKind>();
  for (const StagePlan& s : plan.stages) {
    pc.ranges.push_back({s.begin, s.end});
    pc.evictions.push_back(s.evictions);
  }
  pc.micro_batches = config.micro_batches;
  pc.steps = config.steps;
  pc.seed = config.seed;
  pc.optimizer = config.optimizer;
  pc.device = device;
  pc.data = config.data;
  pc.replica = layout.replica;
  pc.replicas = replicas;
  check_ranges(graph, pc.ranges);
  DeviceMemory::set_capacity(device, capacity);
  if (world.rank == 0 && !quiet) {
    std::printf(
        "training %s: %d nodes, %.2fM parameters, micro-batch %" PRId64 " x %" PRId64 ", %s lr %g, %d stages, %s%s\n",
        graph.preset.c_str(), graph.size(), graph.parameter_count() / 1e6, micro_batch_size, config.micro_batches,
        optimizer_kind_name(config.optimizer.kind), config.optimizer.lr, stages, schedule_kind_name(pc.schedule),
        replicas > 1 ? (", " + std::to_string(replicas) + " data-parallel replicas on " + std::to_string(layout.nodes) +
                        (layout.nodes == 1 ? " host" : " hosts"))
                           .c_str()
                     : "");
    if (!layout.pipelines_within_nodes)
      std::printf(
          "  warning: some host runs a number of ranks that is no multiple of %d stages, so some pipelines "
          "span hosts and send their activations between them\n",
          stages);
    for (const StagePlan& s : plan.stages)
      std::printf("  stage %d: nodes [%d, %d), predicted peak %s\n", s.index, s.begin, s.end,
                  format_bytes(static_cast<double>(s.memory.predicted_peak())).c_str());
    if (pc.schedule == ScheduleKind::Async)
      for (const std::string& name : tied_across_stages(graph, pc))
        std::printf(
            "  note: %s is tied across stages; under async each stage updates its own copy with its own "
            "gradients (the copies drift apart; gpipe and 1f1b sum them)\n",
            name.c_str());
    for (const StagePlan& s : plan.stages)
      if (capacity > 0 && s.memory.predicted_peak() > capacity)
        std::printf(
            "  warning: stage %d is predicted to peak at %s, above --device-memory; the planner's search "
            "model under-estimated it: expect an out-of-memory error\n",
            s.index, format_bytes(static_cast<double>(s.memory.predicted_peak())).c_str());
  }
  DeviceMemory::reset_peak(device);
  RunOptions run;
  run.transport = transport;
  run.trace = vm.count("trace") > 0;
  run.checkpoint_every = checkpoint_every;
  run.resume = resume;
  if (vm.count("checkpoint-dir")) run.checkpoint_dir = vm["checkpoint-dir"].as<std::string>();
  run.preset = graph.preset;
  pc.first_step = first_step;
  // The asynchronous pipeline drains where it writes a checkpoint (PipelineConfig::drain_every).
  if (pc.schedule == ScheduleKind::Async) pc.drain_every = checkpoint_every;
  run.eval_every = eval_every;
  run.eval_batches = eval_batches;
  if (eval_every > 0 && in_process)
    throw ConfigError("--eval-every applies to MPI runs and one-stage runs, not --in-process");
  // Asynchronous pipelines evaluate where they drain.
  if (eval_every > 0 && pc.schedule == ScheduleKind::Async) {
    if (pc.drain_every == 0) pc.drain_every = eval_every;
    if (eval_every % pc.drain_every != 0)
      throw ConfigError(
          "under --schedule async, --eval-every must be a multiple of --checkpoint-every (the pipeline "
          "drains there)");
  }
  Progress progress(pc.first_step, config.steps, samples_per_step, quiet || world.rank != 0, progress_style);
  run.on_loss = [&](const StepLoss& s) { progress.step(s.step, s.loss); };
  run.on_validation = [&](const StepLoss& s) { progress.validation(s.step, s.loss); };
  const auto start = std::chrono::steady_clock::now();
  StageRun mine;
  if (in_process) {
    for (const StepLoss& s : run_pipeline_in_process(graph, pc).losses) run.on_loss(s);
    mine.peak_bytes = DeviceMemory::peak_bytes(device);
  } else {
    // Each replica's pipeline on its own communicator; each stage's replicas on another.
    MPI_Comm pipeline = MPI_COMM_WORLD;
    if (replicas > 1) {
      MPI_Comm_split(MPI_COMM_WORLD, layout.replica, layout.stage, &pipeline);
      MPI_Comm_split(MPI_COMM_WORLD, layout.stage, layout.replica, &run.replica_comm);
    }
    mine = run_pipeline_mpi(graph, pc, pipeline, run);
    if (replicas > 1) MPI_Comm_free(&pipeline), MPI_Comm_free(&run.replica_comm);
  }
  progress.finish();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Per-stage measured peaks, gathered on rank 0 next to the plan's predictions.
  std::vector<int64_t> peaks(static_cast<size_t>(world.size));
  MPI_Gather(&mine.peak_bytes, 1, MPI_INT64_T, peaks.data(), 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  std::vector<int> places(2 * static_cast<size_t>(world.size));  // per rank: replica, stage
  const int place[2] = {layout.replica, layout.stage};
  MPI_Gather(place, 2, MPI_INT, places.data(), 2, MPI_INT, 0, MPI_COMM_WORLD);
  if (run.trace) {
    Trace trace;
    trace.actions = gather_records(mine.actions, MPI_COMM_WORLD);
    double wall = 0;
    MPI_Reduce(&mine.wall_s, &wall, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    StageRecord rec;
    rec.stage = layout.stage;
    rec.rank = world.rank;
    rec.replica = layout.replica;
    rec.node_begin = pc.ranges[static_cast<size_t>(layout.stage)].first;
    rec.node_end = pc.ranges[static_cast<size_t>(layout.stage)].second;
    for (const auto& p : mine.parameters) rec.parameters += p.tensor.numel();
    rec.predicted_peak_bytes = plan.stages[static_cast<size_t>(layout.stage)].memory.predicted_peak();
    rec.predicted_ms_per_micro_batch = plan.stages[static_cast<size_t>(layout.stage)].time_ms();
    rec.measured_peak_bytes = mine.peak_bytes;
    gethostname(rec.host, sizeof rec.host - 1);
    std::vector<StageRecord> records(static_cast<size_t>(world.size));
    MPI_Gather(&rec, sizeof rec, MPI_BYTE, records.data(), sizeof rec, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (world.rank == 0) {
      trace.model = graph.model;
      trace.preset = graph.preset;
      trace.schedule = schedule_kind_name(pc.schedule);
      trace.device = device.str();
      trace.transport = mine.transport;
      trace.stages = stages;
      trace.replicas = replicas;
      trace.micro_batch_size = micro_batch_size;
      trace.micro_batches = config.micro_batches;
      trace.first_step = pc.first_step;
      trace.steps = config.steps;
      trace.wall_s = wall;
      trace.stage_records = records;
      write_trace(trace, vm["trace"].as<std::string>());
    }
  }
  if (!save_path.empty()) {  // replica 0's stages in stage order (the replicas hold the same weights)
    MPI_Comm first_replica;
    MPI_Comm_split(MPI_COMM_WORLD, layout.replica == 0 ? 0 : MPI_UNDEFINED, layout.stage, &first_replica);
    if (first_replica != MPI_COMM_NULL)
      save_weights(mine.parameters, save_path, first_replica), MPI_Comm_free(&first_replica);
  }
  if (world.rank == 0) {
    if (!save_path.empty()) std::printf("wrote weights %s\n", save_path.c_str());
    if (!in_process && !quiet)
      std::printf("  transport: %s on %s\n", mine.transport.c_str(), device.is_cuda() ? "cuda" : "cpu");
    if (!in_process)
      for (int r = 0; r < world.size; ++r) {
        const int stage = places[2 * r + 1];
        std::printf("  stage %d%s: measured peak %s (predicted %s)\n", stage,
                    replicas > 1 ? (" of replica " + std::to_string(places[2 * r])).c_str() : "",
                    format_bytes(double(peaks[r])).c_str(),
                    format_bytes(double(plan.stages[static_cast<size_t>(stage)].memory.predicted_peak())).c_str());
      }
    const double trained = static_cast<double>(config.steps - pc.first_step);
    // Steady state first: the first step pays for the pipeline fill and first allocations.
    std::printf("done: %" PRId64 " steps, final loss %.9g, %.1f samples/s after the first step (%.1f with it)\n",
                config.steps, progress.last_loss(), progress.steady_samples_per_second(),
                seconds > 0 ? samples_per_step * trained / seconds : 0.0);
    if (run.trace)
      std::printf("wrote trace %s (dawnpiper inspect %s)\n", vm["trace"].as<std::string>().c_str(),
                  vm["trace"].as<std::string>().c_str());
  }
  return 0;
}

}  // namespace dawnpiper
