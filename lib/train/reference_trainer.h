#pragma once
// The reference trainer: the whole graph as one stage in one process, gradient accumulation over
// `micro_batches` micro-batches per step. It is the ground truth pipeline runs are compared with.
#include <cstdint>
#include <functional>
#include <vector>

#include "data/synthetic.h"
#include "data/token_file.h"
#include "exec/stage_module.h"
#include "train/optimizer.h"

namespace dawnpiper {

struct TrainConfig {
  int64_t steps = 10;
  int64_t micro_batches = 1;
  uint64_t seed = 42;
  OptimizerConfig optimizer;
  DataConfig data;
};

struct StepResult {
  int64_t step = 0;
  double loss = 0;         // mean over the step's micro-batches
  double lr = 0;           // the rate the step's update used
  double grad_norm = 0;    // global gradient norm before clipping
  double seconds = 0;      // wall time of the step
  int64_t peak_bytes = 0;  // counting allocator's peak during the step (CPU), 0 if not counted
};

class ReferenceTrainer {
 public:
  ReferenceTrainer(const OpGraph& graph, const TrainConfig& config);
  // Runs one step; throws Error on a non-finite loss (naming the step) or out of memory.
  StepResult step();
  // Runs config.steps steps, calling `report` after each.
  std::vector<StepResult> run(const std::function<void(const StepResult&)>& report = {});
  // Mean loss over the first `batches` micro-batches of the validation split (no autograd, no
  // dropout).
  double evaluate(int64_t batches);
  StageModule& module() { return module_; }

 private:
  const OpGraph& graph_;
  TrainConfig config_;
  StageModule module_;
  std::unique_ptr<DataSource> data_, validation_;
  std::vector<int> data_inputs_;
  std::unique_ptr<Optimizer> optimizer_;
  int64_t next_step_ = 0;
};

}  // namespace dawnpiper
