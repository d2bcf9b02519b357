#include "profile/measure_updates.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdio>

#include "memory/device_memory.h"
#include "train/grad_norm.h"
#include "train/optimizer.h"
#include "util/enum_names.h"
#include "util/stopwatch.h"

namespace dawnpiper {

namespace {
constexpr int kWarmup = 2, kMeasured = 5;

double median_update_ms(OptimizerKind kind, const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                        c10::Device device) {
  OptimizerConfig config;
  config.kind = kind;
  config.lr = 1e-4;
  config.weight_decay = 0.01;
  std::unique_ptr<Optimizer> optimizer = make_optimizer(config, params);
  std::vector<double> times;
  for (int s = 0; s < kWarmup + kMeasured; ++s) {
    for (size_t k = 0; k < params.size(); ++k) params[k].mutable_grad() = grads[k].clone();  // step() spends them
    synchronize(device);
    const Stopwatch clock;
    grad_square_sum(params);  // a synchronous step's update starts with the global norm
    optimizer->step();
    synchronize(device);
    if (s >= kWarmup) times.push_back(clock.ms());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}
}  // namespace

UpdateTimes measure_update_times(const OpGraph& graph, const ProfilerOptions& options, int64_t sample_bytes) {
  UpdateTimes result;
  std::vector<Shape> shapes;
  int64_t all = 0, sampled = 0;
  for (const Node& n : graph.nodes)
    for (const ParamSpec& p : n.params) {
      if (p.tied()) continue;
      const int64_t bytes = numel(p.shape) * static_cast<int64_t>(sizeof(float));
      all += bytes;
      if (sampled < sample_bytes) shapes.push_back(p.shape), sampled += bytes;
    }
  if (sampled == 0) return result;
  try {
    at::NoGradGuard no_grad;
    const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat).device(options.device);
    std::vector<at::Tensor> params, grads;
    for (const Shape& s : shapes) {
      params.push_back(at::randn(s, f32).set_requires_grad(true));
      grads.push_back(at::randn(s, f32));
    }
    const double scale = static_cast<double>(all) / static_cast<double>(sampled);
    for (const auto& [kind, name] : EnumNames<OptimizerKind>::table)
      result.of(kind) = scale * median_update_ms(kind, params, grads, options.device);
  } catch (const std::exception& e) {
    if (!is_out_of_memory(e)) throw;
    if (options.progress) std::fprintf(stderr, "the optimizers' updates do not fit: the plan charges none\n");
    result = UpdateTimes{};
  }
  DeviceMemory::release_cached(options.device);  // what the nodes' measurements can use
  return result;
}

}  // namespace dawnpiper
