// dawnpiper profile: measure every node of a model's op graph and store the profile in HDF5.
#include <cstdio>
#include <sstream>

#include "app/commands.h"
#include "cli/options.h"
#include "memory/counting_allocator.h"
#include "memory/device_memory.h"
#include "profile/analytic.h"
#include "plan/stage_memory.h"
#include "profile/profile_io.h"
#include "profile/profiler.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/units.h"
#include "util/stopwatch.h"

namespace dawnpiper {

namespace {
std::vector<int64_t> parse_batch_sizes(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v < 1) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      throw ConfigError("--batch-sizes '" + text + "': expected positive integers separated by commas");
    }
  }
  if (out.empty()) throw ConfigError("--batch-sizes is empty");
  return out;
}

po::options_description profile_options() {
  po::options_description own("Profile options");
  // clang-format off
  own.add_options()
      ("out", po::value<std::string>(), "HDF5 file to write (required)")
      ("batch-sizes", po::value<std::string>(), "micro-batch sizes to profile for the batch-size fit "
                                                "(default: B, 2B and 3B for --micro-batch-size B)")
      ("warmup", po::value<int>()->default_value(2), "unmeasured iterations per node")
      ("iterations", po::value<int>()->default_value(5), "measured iterations per node")
      ("timing", po::value<NodeTiming>()->default_value(NodeTiming::InStep, "in-step"),
       "node times from whole training steps (in-step; falls back to isolated when the step does "
       "not fit) or from each node run alone (isolated)")
      ("share-blocks", po::bool_switch(), "profile repeated layers/cells once and reuse the numbers")
      ("optimizer", po::value<OptimizerKind>()->default_value(OptimizerKind::Sgd, name_of(OptimizerKind::Sgd)),
       (enum_help<OptimizerKind>() + ": optimizer of the cross-check step").c_str())
      ("no-step-check", po::bool_switch(), "skip the whole-step measurement (models that do not fit)")
      ("analytic", po::bool_switch(), "estimate from shapes and a device spec instead of measuring")
      ("device-spec", po::value<std::string>(), "with --analytic: a100-40gb | h100-80gb | spec file");
  // clang-format on
  po::options_description options;
  options.add(own)
      .add(run_options(RunOptionSet{/*micro_batches=*/false, /*quiet=*/true}))
      .add(model_override_options());
  return options;
}

// The micro-batch sizes to profile: --batch-sizes, or B, 2B and 3B for --micro-batch-size B.
std::vector<int64_t> batch_sizes(const po::variables_map& vm) {
  const int64_t B = vm["micro-batch-size"].as<int64_t>();
  if (B < 1) throw ConfigError("micro-batch size must be at least 1");
  const std::vector<int64_t> sizes = vm.count("batch-sizes") ? parse_batch_sizes(vm["batch-sizes"].as<std::string>())
                                                             : std::vector<int64_t>{B, 2 * B, 3 * B};
  // The profile is taken at the first size; a different --micro-batch-size would be dropped.
  if (!vm["micro-batch-size"].defaulted() && sizes.front() != B)
    throw ConfigError("--batch-sizes profiles at its first size, " + std::to_string(sizes.front()) +
                      ", not --micro-batch-size " + std::to_string(B) + ": give one, or list " + std::to_string(B) +
                      " first");
  return sizes;
}

// --analytic with its --device-spec, and none of the options that set how nodes are measured.
bool is_analytic(const po::variables_map& vm) {
  const bool analytic = vm["analytic"].as<bool>();
  if (vm.count("device-spec") && !analytic) throw ConfigError("--device-spec needs --analytic");
  if (analytic && !vm.count("device-spec")) throw ConfigError("--analytic needs --device-spec (e.g. a100-40gb)");
  if (analytic)
    for (const char* measuring : {"warmup", "iterations", "timing", "share-blocks", "no-step-check"})
      if (!vm[measuring].defaulted())
        throw ConfigError("--" + std::string(measuring) + " sets how nodes are measured; --analytic measures none");
  return analytic;
}

}  // namespace

int cmd_profile(int argc, char** argv, const MpiWorld& world) {
  po::variables_map vm;
  if (!parse_options(argc, argv, "profile",
                     "Measures per-node time and memory of a model's op graph and writes an HDF5 profile.",
                     profile_options(), vm))
    return 0;
  if (!vm.count("out")) throw ConfigError("--out FILE is required (where to write the profile)");
  if (world.rank != 0) return 0;
  ProfilerOptions opt;
  opt.device = parse_device(vm["device"].as<DeviceKind>());
  opt.seed = vm["seed"].as<uint64_t>();
  opt.warmup = vm["warmup"].as<int>();
  opt.iterations = vm["iterations"].as<int>();
  if (opt.iterations < 1 || opt.warmup < 0) throw ConfigError("--iterations must be >= 1 and --warmup >= 0");
  opt.share_repeated_blocks = vm["share-blocks"].as<bool>();
  opt.in_step_timing = vm["timing"].as<NodeTiming>() == NodeTiming::InStep;
  const bool quiet = vm["quiet"].as<bool>();
  opt.progress = !quiet;
  CountingAllocator::install();
  if (vm.count("device-memory"))
    DeviceMemory::set_capacity(opt.device, parse_capacity(vm["device-memory"].as<std::string>(), "--device-memory"));
  const std::vector<int64_t> sizes = batch_sizes(vm);
  const ModelSource model = model_source_from(vm);
  const OptimizerKind optimizer = vm["optimizer"].as<OptimizerKind>();
  const std::string out = vm["out"].as<std::string>();
  check_writable(out);

  const bool analytic = is_analytic(vm);
  const Stopwatch clock;
  // Operators without a roofline formula: what autograd keeps is measured here.
  const MeasureNode measure = [&opt](const OpGraph& g, int node) { return measure_node_facts(g, node, opt); };
  Profile p = analytic ? analytic_profile_model(model, sizes, device_spec(vm["device-spec"].as<std::string>()), measure)
                       : profile_model(model, sizes, opt);
  const double seconds = clock.seconds();
  if (!analytic && !vm["no-step-check"].as<bool>()) {
    StepMeasurement step = measure_step(model.graph(sizes.front()), optimizer, opt);
    p.measured_step_ms = step.step_ms;
    // In-step timing measured forward+backward alongside the node times; keep that figure.
    if (p.measured_fwd_bwd_ms == 0) p.measured_fwd_bwd_ms = step.fwd_bwd_ms;
    p.measured_peak_bytes = step.peak_bytes;
  }
  write_profile(p, out);

  double node_ms = 0;
  for (const NodeProfile& n : p.nodes) node_ms += n.fwd_ms + n.bwd_ms;
  const StageMemoryReplay replay = replay_whole_step(p, optimizer);
  std::printf("profiled %s: %d nodes at micro-batch sizes", p.preset.c_str(), p.size());
  for (int64_t b : sizes) std::printf(" %lld", static_cast<long long>(b));
  std::printf(" on %s in %.1f s (%s node times)", p.device.c_str(), seconds, p.timing.c_str());
  if (sizes.size() > 2) std::printf("; batch-size fit max error %.1f%%", 100 * p.fit_max_rel_error);
  std::printf("\n");
  std::printf("micro-batch %lld: sum of node times %.2f ms", static_cast<long long>(p.micro_batch_size), node_ms);
  if (p.measured_fwd_bwd_ms > 0)
    std::printf(", measured forward+backward %.2f ms (%+.1f%%), whole step with optimizer %.2f ms",
                p.measured_fwd_bwd_ms, 100 * (node_ms / p.measured_fwd_bwd_ms - 1), p.measured_step_ms);
  if (p.update_ms.adamw > 0)
    std::printf("\none optimizer update of every parameter (%s): sgd %.2f ms, adam %.2f ms, adamw %.2f ms",
                analytic ? "the roofline's" : "measured", p.update_ms.sgd, p.update_ms.adam, p.update_ms.adamw);
  std::printf("\npredicted peak %s", format_bytes(double(replay.peak)).c_str());
  if (p.runtime_bytes > 0)
    std::printf(" (with %s the device runtime holds: cuBLAS workspaces)",
                format_bytes(double(p.runtime_bytes)).c_str());
  if (p.measured_peak_bytes > 0)
    std::printf(", measured peak %s (%+.1f%%)", format_bytes(double(p.measured_peak_bytes)).c_str(),
                100 * (double(replay.peak) / double(p.measured_peak_bytes) - 1));
  if (!p.notes.empty()) std::printf("\nnote: %s", p.notes.c_str());
  std::printf("\nwrote %s\n", out.c_str());
  return 0;
}

}  // namespace dawnpiper
