#include "train/reference_trainer.h"

#include <cmath>

#include <ATen/core/grad_mode.h>

#include "memory/counting_allocator.h"
#include "memory/device_memory.h"
#include "train/grad_norm.h"
#include "util/error.h"
#include "util/stopwatch.h"

namespace dawnpiper {

ReferenceTrainer::ReferenceTrainer(const OpGraph& graph, const TrainConfig& config)
    : graph_(graph),
      config_(config),
      module_(graph, 0, graph.size(), config.seed),
      data_(make_data_source(graph, config.data, config.seed, DataSplit::Train,
                             graph.micro_batch_size * config.micro_batches)),
      data_inputs_(graph.data_inputs(0, graph.size())) {
  if (config.micro_batches < 1) throw ConfigError("--micro-batches must be at least 1");
  if (config.steps < 0) throw ConfigError("--steps must not be negative");
  std::vector<at::Tensor> params;
  for (const auto& p : module_.parameters()) params.push_back(p.tensor);
  optimizer_ = make_optimizer(config.optimizer, std::move(params));
}

StepResult ReferenceTrainer::step() {
  const Stopwatch clock;
  CountingAllocator* counter = CountingAllocator::instance();
  if (counter) counter->reset_peak();
  const int loss_tensor = graph_.nodes[graph_.loss_node()].outputs[0];
  double loss_sum = 0;
  for (int64_t mb = 0; mb < config_.micro_batches; ++mb) {
    TensorEnv env = module_.make_env();
    data_->load(env, data_inputs_, data_->first_sample(next_step_, mb, config_.micro_batches), module_.device());
    module_.forward(env, RunContext{next_step_, next_step_ * config_.micro_batches + mb});
    at::Tensor loss = env[loss_tensor];
    const double value = loss.item<double>();
    if (!std::isfinite(value))
      throw Error("loss is " + std::to_string(value) + " at step " + std::to_string(next_step_) + ", micro-batch " +
                  std::to_string(mb) + "; lower --lr");
    loss_sum += value;
    (loss / static_cast<double>(config_.micro_batches)).backward();
  }
  StepResult r;
  r.grad_norm = std::sqrt(grad_square_sum(optimizer_->params()));
  if (config_.optimizer.grad_clip > 0) clip_grads(optimizer_->params(), r.grad_norm, config_.optimizer.grad_clip);
  r.lr = scheduled_lr(config_.optimizer.lr, config_.optimizer.schedule, next_step_);
  optimizer_->set_lr(r.lr);
  optimizer_->step();
  synchronize(module_.device());  // the step is timed when the device has done it
  r.step = next_step_++;
  r.loss = loss_sum / static_cast<double>(config_.micro_batches);
  r.seconds = clock.seconds();
  r.peak_bytes = counter ? counter->peak_bytes() : 0;
  return r;
}

double ReferenceTrainer::evaluate(int64_t batches) {
  at::NoGradGuard no_grad;
  if (!validation_)
    validation_ = make_data_source(graph_, config_.data, config_.seed, DataSplit::Validation, graph_.micro_batch_size);
  const int loss_tensor = graph_.nodes[graph_.loss_node()].outputs[0];
  double sum = 0;
  for (int64_t k = 0; k < batches; ++k) {
    TensorEnv env = module_.make_env();
    validation_->load(env, data_inputs_, k * graph_.micro_batch_size, module_.device());
    RunContext ctx{-1, k};
    ctx.eval = true;
    module_.forward(env, ctx);
    sum += env[loss_tensor].item<double>();
  }
  return sum / static_cast<double>(batches);
}

std::vector<StepResult> ReferenceTrainer::run(const std::function<void(const StepResult&)>& report) {
  std::vector<StepResult> results;
  for (int64_t s = 0; s < config_.steps; ++s) {
    results.push_back(step());
    if (report) report(results.back());
  }
  return results;
}

}  // namespace dawnpiper
