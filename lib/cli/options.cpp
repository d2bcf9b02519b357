#include "cli/options.h"

#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>

#include "util/error.h"
#include "util/units.h"

namespace dawnpiper {

po::options_description model_options() {
  po::options_description d("Model options");
  // clang-format off
  d.add_options()
      ("config", po::value<std::string>(), "read options from an .ini file (key = value lines)")
      ("model", po::value<std::string>()->default_value("gpt2-tiny"), "model preset (see `dawnpiper graph --list`)")
      ("model-file", po::value<std::string>(), "an imported model (scripts/export_model.py; docs/model-format.md) instead of a preset")
      ("precision", po::value<Precision>(), "fp32 (default) | bf16: bf16 compute, fp32 master weights and optimizer state "
                                              "(a model file has the precision it was exported with)")
      ("micro-batch-size", po::value<int64_t>()->default_value(4), "samples per micro-batch");
  // clang-format on
  return d;
}

po::options_description run_options(const RunOptionSet& set) {
  po::options_description weights("Weights");
  // clang-format off
  weights.add_options()
      ("init-from", po::value<std::string>(), "with --model-file: initial weights from this safetensors checkpoint (PyTorch names, "
                                              "e.g. a Hugging Face model.safetensors)")
      ("seed", po::value<uint64_t>()->default_value(42), "seed for a preset's initial parameters (a --model-file starts from its file's "
                                                          "weights, or --init-from's), the data order and dropout");
  // clang-format on
  po::options_description d("Common options");
  if (set.micro_batches)
    d.add_options()("micro-batches", po::value<int64_t>()->default_value(4),
                    "micro-batches per step (mini-batch = size x count)");
  // clang-format off
  d.add_options()
      ("device", po::value<DeviceKind>()->default_value(DeviceKind::Cpu, name_of(DeviceKind::Cpu)), enum_help<DeviceKind>().c_str())
      ("device-memory", po::value<std::string>(), "device memory capacity per rank, e.g. 512MiB, 40GiB (CPU: enforced by the counting allocator; CUDA: the "
                                                     "caching allocator's limit; train on CUDA without it: the GPU's free memory "
                                                     "shared by its ranks; plan without it: --device-spec's, else unlimited)");
  // clang-format on
  if (set.quiet) d.add_options()("quiet", po::bool_switch(), "print only errors and the final summary");
  po::options_description all;
  all.add(model_options()).add(weights).add(d);
  return all;
}

po::options_description allocator_headroom_option() {
  po::options_description d("Memory");
  // clang-format off
  d.add_options()
      ("allocator-headroom", po::value<std::string>(), "share of --device-memory the plan leaves free for the device allocator's "
                                                       "fragmentation, e.g. 5%; default 5% for a CUDA profile, 0 on the CPU");
  // clang-format on
  return d;
}

namespace {
// The pipeline planners, and the baselines only `plan` computes.
std::string planner_help() {
  static const auto pipeline = [](PlannerKind k) { return k != PlannerKind::Zero2 && k != PlannerKind::Zero3; };
  return enum_help<PlannerKind>(+pipeline) +
         "; `plan` also: " + enum_help<PlannerKind>(+[](PlannerKind k) { return !pipeline(k); }) +
         " (ZeRO's data-parallel baseline)";
}
}  // namespace

po::options_description planning_options() {
  po::options_description d("Planning options (the same defaults for plan and train)");
  // clang-format off
  d.add_options()
      ("stages", po::value<int>(), "pipeline stages, one per rank (default: the MPI ranks / --data-parallel; `plan` "
                                   "without mpirun has no ranks to count and needs it)")
      ("virtual-stages", po::value<int>()->default_value(0), "stages per rank under --schedule interleaved (default 2): "
                                                             "--stages x V stages, stage s on rank s mod --stages")
      ("data-parallel", po::value<int>(), "pipeline replicas D training on their own shares of the data, their gradients "
                                          "averaged every step (default: the MPI ranks / --stages; `plan` in one process: 1)")
      ("schedule", po::value<ScheduleRequest>()->default_value(ScheduleRequest(), "1f1b"), schedule_help().c_str())
      ("planner", po::value<PlannerKind>()->default_value(PlannerKind::DawnPiper, "dawnpiper"), planner_help().c_str())
      ("optimizer", po::value<OptimizerKind>()->default_value(OptimizerKind::Sgd, name_of(OptimizerKind::Sgd)),
       (enum_help<OptimizerKind>() + " (its state is part of each stage's memory; sgd with --momentum)").c_str())
      ("memopt", po::value<MemoptKind>()->default_value(MemoptKind::None, "none"),
       ("memory optimization the plan may use: " + enum_help<MemoptKind>() + "; the runtime carries out its per-tensor decisions").c_str())
      ("zero-stage", po::value<int>()->default_value(0), "sharded data parallelism within each stage's replicas (DeepSpeed's "
                                                         "levels): 0 none; 1 optimizer state and fp32 masters split D ways, "
                                                         "gradients reduce-scattered, parameters all-gathered; 2 gradients "
                                                         "split too, reduce-scattered as each micro-batch's backward "
                                                         "produces them; 3 parameters split too, each bucket gathered "
                                                         "where it is read and let go after")
      ("bucket-size", po::value<std::string>()->default_value("25MiB"), "gradients travel between replicas in flat buckets "
                                                                         "of about this size (every --zero-stage; 0 at "
                                                                         "level 0: parameter by parameter)");
  // clang-format on
  return d;
}

double replica_bandwidth_option(const po::variables_map& vm) {
  if (!vm.count("replica-bandwidth")) return 0;
  const double bandwidth =
      static_cast<double>(parse_bytes(vm["replica-bandwidth"].as<std::string>(), "--replica-bandwidth"));
  if (!(bandwidth > 0)) throw ConfigError("--replica-bandwidth must be positive (bytes/s, e.g. 2GB)");
  return bandwidth;
}

double replica_drag_option(const po::variables_map& vm) {
  if (!vm.count("replica-drag")) return -1;
  const double drag = vm["replica-drag"].as<double>();
  if (!(drag >= 0) || !std::isfinite(drag))
    throw ConfigError(
        "--replica-drag must be 0 or more (the ms a computing rank's pass takes longer per ms of its replicas' "
        "collectives beside it; 0: they run beside the compute)");
  return drag;
}

PlanRequest plan_request_from(const po::variables_map& vm) {
  PlanRequest r;
  r.ranks = vm.count("stages") ? vm["stages"].as<int>() : 0;
  if (vm.count("stages") && r.ranks < 1) throw ConfigError("--stages must be at least 1");
  r.data_parallel = vm.count("data-parallel") ? vm["data-parallel"].as<int>() : 0;
  if (vm.count("data-parallel") && r.data_parallel < 1) throw ConfigError("--data-parallel must be at least 1");
  r.schedule = vm["schedule"].as<ScheduleRequest>().with_virtual_stages(vm["virtual-stages"].as<int>());
  r.micro_batches = vm["micro-batches"].as<int64_t>();
  if (r.micro_batches < 1) throw ConfigError("--micro-batches must be at least 1");
  // A schedule file is written for its sizes: other ones are refused before anything runs.
  for (const ScheduleChoice& s : r.schedule.candidates())
    if (s.is_file()) s.make(r.ranks > 0 ? r.ranks * s.virtual_stages() : s.file_stages(), r.micro_batches);
  r.optimizer = vm["optimizer"].as<OptimizerKind>();
  r.planner = vm["planner"].as<PlannerKind>();
  r.memopt = vm["memopt"].as<MemoptKind>();
  r.fit_replayed = true;
  r.zero_stage = vm["zero-stage"].as<int>();
  if (r.zero_stage < 0 || r.zero_stage > 3)
    throw ConfigError("--zero-stage " + std::to_string(r.zero_stage) +
                      " is no level of sharded data parallelism: 0 (none), 1, 2 or 3 (DeepSpeed's)");
  r.bucket_bytes = parse_bytes(vm["bucket-size"].as<std::string>(), "--bucket-size");
  // 0: level 0 averages parameter by parameter (the averaging before buckets, to compare with).
  if (r.bucket_bytes < 4 && !(r.bucket_bytes == 0 && r.zero_stage == 0))
    throw ConfigError("--bucket-size must hold at least one fp32 element (4 bytes)" +
                      std::string(r.bucket_bytes == 0 ? " under --zero-stage " + std::to_string(r.zero_stage) +
                                                            " (0 bytes: level 0 only, parameter by parameter)"
                                                      : ""));
  if (r.zero_stage == 0) return r;
  for (const ScheduleChoice& s : r.schedule.candidates())
    if (const std::string refusal = zero_refusal(r.zero_stage, s); !refusal.empty()) throw ConfigError(refusal);
  return r;
}

PlannedRun planned_run(const Plan& plan) {
  PlannedRun r;
  static_cast<PlanSettings&>(r.request) = plan.options;
  r.request.schedule = plan.options.schedule;
  r.request.ranks = static_cast<int>(plan.stages.size()) / plan.options.schedule.virtual_stages();
  r.micro_batch_size = plan.micro_batch_size;
  r.precision = plan.precision;
  return r;
}

namespace {

// --schedule auto agrees with the schedule it resolved to; --virtual-stages is compared on its own.
bool agrees(const ScheduleRequest& given, const ScheduleRequest& planned) { return given.admits(planned.choice()); }
template <class T>
bool agrees(const T& given, const T& planned) {
  return given == planned;
}

// An option of type T whose plan's value `of` gives.
template <class T, class Of>
PlannedOption planned(const std::string& key, bool resumed, Of of) {
  PlannedOption o;
  o.key = key;
  o.resumed = resumed;
  o.value = [of](const PlannedRun& r) { return boost::any(T(of(r))); };
  o.agrees = [](const boost::any& given, const boost::any& planned) {
    return agrees(boost::any_cast<const T&>(given), boost::any_cast<const T&>(planned));
  };
  o.text = [](const boost::any& value) {
    std::ostringstream out;
    out << boost::any_cast<const T&>(value);
    return out.str();
  };
  o.compared = [text = o.text, value = o.value](const PlannedRun& r) { return text(value(r)); };
  return o;
}

std::vector<PlannedOption> make_planned_options() {
  std::vector<PlannedOption> all;
  all.push_back(planned<Precision>("precision", false, [](const PlannedRun& r) { return r.precision; }));
  all.push_back(planned<int>("stages", false, [](const PlannedRun& r) { return r.request.ranks; }));
  all.push_back(planned<int>("data-parallel", false, [](const PlannedRun& r) { return r.request.data_parallel; }));
  all.push_back(planned<ScheduleRequest>("schedule", true, [](const PlannedRun& r) { return r.request.schedule; }));
  all.push_back(
      planned<int>("virtual-stages", true, [](const PlannedRun& r) { return r.request.schedule.virtual_stages(); }));
  all.back().with_schedule = true;
  all.push_back(planned<PlannerKind>("planner", true, [](const PlannedRun& r) { return r.request.planner; }));
  all.push_back(planned<MemoptKind>("memopt", true, [](const PlannedRun& r) { return r.request.memopt; }));
  // The plan's memory holds for its micro-batching alone.
  all.push_back(planned<int64_t>("micro-batch-size", true, [](const PlannedRun& r) { return r.micro_batch_size; }));
  all.push_back(planned<int64_t>("micro-batches", true, [](const PlannedRun& r) { return r.request.micro_batches; }));
  all.push_back(planned<OptimizerKind>("optimizer", false, [](const PlannedRun& r) { return r.request.optimizer; }));
  // Without replicas no level is in effect: a resumed run compares the level in effect.
  all.push_back(planned<int>("zero-stage", false, [](const PlannedRun& r) { return r.request.zero_stage; }));
  all.back().compared = [](const PlannedRun& r) { return std::to_string(r.request.sharding()); };
  // A size is text on the command line: compared by its bytes, and only where both shard.
  all.push_back(planned<std::string>("bucket-size", false,
                                     [](const PlannedRun& r) { return std::to_string(r.request.bucket_bytes); }));
  all.back().agrees = [](const boost::any& given, const boost::any& planned) {
    return parse_bytes(boost::any_cast<const std::string&>(given), "--bucket-size") ==
           parse_bytes(boost::any_cast<const std::string&>(planned), "--bucket-size");
  };
  all.back().text = [](const boost::any& value) {
    const std::string& text = boost::any_cast<const std::string&>(value);
    return text.find_first_not_of("0123456789") == std::string::npos ? text + " bytes" : text;
  };
  all.back().compared = [](const PlannedRun& r) {
    return r.request.sharding() > 0 ? format_bytes(static_cast<double>(r.request.bucket_bytes)) : std::string();
  };
  return all;
}

}  // namespace

const std::vector<PlannedOption>& planned_options() {
  static const std::vector<PlannedOption> all = make_planned_options();
  return all;
}

po::options_description model_override_options() {
  po::options_description d("Model overrides (change a preset)");
  // clang-format off
  d.add_options()
      ("layers", po::value<int64_t>(), "transformer layers / AmoebaNet normal cells per stack / MLP layers")
      ("decoder-layers", po::value<int64_t>(), "T5 decoder layers")
      ("hidden", po::value<int64_t>(), "hidden width (AmoebaNet: filters)")
      ("heads", po::value<int64_t>(), "attention heads")
      ("ffn", po::value<int64_t>(), "feed-forward width")
      ("vocab", po::value<int64_t>(), "vocabulary size")
      ("seq-len", po::value<int64_t>(), "sequence length")
      ("image-size", po::value<int64_t>(), "image side (multiple of 32)")
      ("classes", po::value<int64_t>(), "output classes")
      ("in-features", po::value<int64_t>(), "MLP input width")
      ("output-chunks", po::value<int64_t>(), "split the LM head into this many vocabulary ranges, so a stage cut may fall inside it")
      ("attention", po::value<AttentionKind>(), enum_help<AttentionKind>().c_str())
      ("loss-chunk-tokens", po::value<int64_t>(), "fuse the LM head with its loss, computing the logits of this many positions at a time (never all of them)")
      ("dropout", po::value<double>(), "dropout probability");
  // clang-format on
  return d;
}

bool parse_options(int argc, char** argv, const std::string& subcommand, const std::string& summary,
                   const po::options_description& options, po::variables_map& vm,
                   const po::positional_options_description* positional) {
  po::options_description all;
  // clang-format off
  all.add_options()("help,h", "show this help");
  // clang-format on
  all.add(options);
  try {
    po::command_line_parser parser(argc, argv);
    parser.options(all);
    if (positional) parser.positional(*positional);
    po::store(parser.run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: dawnpiper " << subcommand << " [options]\n" << summary << "\n\n" << all << "\n";
      return false;
    }
    if (vm.count("config")) {
      const std::string path = vm["config"].as<std::string>();
      std::ifstream in(path);
      if (!in) throw ConfigError("cannot read config file '" + path + "'");
      po::store(po::parse_config_file(in, all), vm);
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw ConfigError(std::string(e.what()) + " (see `dawnpiper " + subcommand + " --help`)");
  }
  return true;
}

ModelConfig model_config_from(const po::variables_map& vm) {
  ModelConfig c = preset_config(vm["model"].as<std::string>());
  for (const std::string& name : integer_override_names())
    if (vm.count(name)) set_integer_override(c, name, vm[name].as<int64_t>());
  if (vm.count("dropout")) set_dropout(c, vm["dropout"].as<double>());
  if (vm.count("attention")) c.fused_attention = vm["attention"].as<AttentionKind>() == AttentionKind::Fused;
  check_config(c);
  return c;
}

ModelSource model_source_from(const po::variables_map& vm) {
  if (!vm.count("model-file")) {
    if (vm.count("init-from")) throw ConfigError("--init-from needs --model-file (presets start from their seed)");
    return ModelSource::preset(model_config_from(vm),
                               vm.count("precision") ? vm["precision"].as<Precision>() : Precision::Fp32);
  }
  if (!vm["model"].defaulted()) throw ConfigError("give either --model or --model-file, not both");
  const po::options_description overrides = model_override_options();
  for (const auto& opt : overrides.options())
    if (vm.count(opt->long_name()))
      throw ConfigError("--" + opt->long_name() +
                        " changes a preset; an imported model is fixed by its file (export it again)");
  return ModelSource::file(
      vm["model-file"].as<std::string>(), vm.count("init-from") ? vm["init-from"].as<std::string>() : "",
      vm.count("precision") ? std::optional<Precision>(vm["precision"].as<Precision>()) : std::nullopt);
}

}  // namespace dawnpiper
