// dawnpiper train: with --stages 1 the reference trainer (whole model, one process).
#include <cinttypes>
#include <cstdio>


#include "app/commands.h"
#include "cli/options.h"
#include "memory/counting_allocator.h"
#include "train/reference_trainer.h"
#include "util/error.h"
#include "util/units.h"

namespace dawnpiper {

int cmd_train(int argc, char** argv, const MpiWorld& world) {
  po::options_description options;
  po::options_description own("Training options");
  own.add_options()
      ("stages", po::value<int>(), "pipeline stages (default: the number of MPI ranks)")
      ("steps", po::value<int64_t>()->default_value(10), "training steps")
      ("optimizer", po::value<std::string>()->default_value("sgd"), "sgd (with momentum) | adam")
      ("lr", po::value<double>()->default_value(0.01), "learning rate")
      ("momentum", po::value<double>()->default_value(0.9), "SGD momentum");
  options.add(own).add(common_options()).add(model_override_options());
  po::variables_map vm;
  if (!parse_options(argc, argv, "train", "Trains a model; --stages 1 is the single-process reference trainer.",
                     options, vm))
    return 0;
  const int stages = vm.count("stages") ? vm["stages"].as<int>() : world.size;
  if (stages < 1) throw ConfigError("--stages must be at least 1");
  if (stages != world.size)
    throw ConfigError("--stages " + std::to_string(stages) + " but " + std::to_string(world.size) +
                      " MPI ranks: launch with `mpirun -np " + std::to_string(stages) + "`");
  if (stages > 1)
    throw ConfigError("pipeline training over " + std::to_string(stages) +
                      " stages needs the distributed runtime, which this build does not have yet; "
                      "run with --stages 1 (one rank)");

  const std::string device = vm["device"].as<std::string>();
  if (device != "cpu" && device != "cuda") throw ConfigError("--device must be cpu or cuda, got '" + device + "'");
  if (device == "cuda") throw ConfigError("--device cuda: the trainer runs on the CPU in this build");
  CountingAllocator& counter = CountingAllocator::install();
  if (vm.count("device-memory"))
    counter.set_capacity(parse_bytes(vm["device-memory"].as<std::string>(), "--device-memory"));

  ModelConfig model = model_config_from(vm);
  const int64_t micro_batch_size = vm["micro-batch-size"].as<int64_t>();
  OpGraph graph = build_model(model, micro_batch_size);
  TrainConfig config;
  config.steps = vm["steps"].as<int64_t>();
  config.micro_batches = vm["micro-batches"].as<int64_t>();
  config.seed = vm["seed"].as<uint64_t>();
  config.optimizer.kind = vm["optimizer"].as<std::string>();
  config.optimizer.lr = vm["lr"].as<double>();
  config.optimizer.momentum = vm["momentum"].as<double>();
  const bool quiet = vm["quiet"].as<bool>();

  ReferenceTrainer trainer(graph, config);
  if (!quiet)
    std::printf("training %s: %d nodes, %.2fM parameters, micro-batch %" PRId64 " x %" PRId64
                ", %s lr %g, 1 stage\n",
                graph.preset.c_str(), graph.size(), graph.parameter_count() / 1e6, micro_batch_size,
                config.micro_batches, config.optimizer.kind.c_str(), config.optimizer.lr);
  double seconds = 0;
  int64_t peak = 0;
  double last_loss = 0;
  trainer.run([&](const StepResult& r) {
    seconds += r.seconds;
    peak = std::max(peak, r.peak_bytes);
    last_loss = r.loss;
    if (!quiet)
      std::printf("step %" PRId64 " loss %.9g time %.3fs peak %s\n", r.step, r.loss, r.seconds,
                  format_bytes(static_cast<double>(r.peak_bytes)).c_str());
    std::fflush(stdout);
  });
  const double samples = static_cast<double>(config.steps * config.micro_batches * micro_batch_size);
  std::printf("done: %" PRId64 " steps, final loss %.9g, %.1f samples/s, peak memory %s\n",
              config.steps, last_loss, seconds > 0 ? samples / seconds : 0.0,
              format_bytes(static_cast<double>(peak)).c_str());
  return 0;
}

}  // namespace dawnpiper
