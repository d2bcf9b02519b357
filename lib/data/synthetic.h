#pragma once
// Seeded synthetic data per model family, learnable so that training visibly lowers the loss:
//   gpt2: token sequences following x[t+1] = (a * x[t] + c) mod V from a random start; labels
//         are the next tokens.
//   bert: the same sequences with 15% of positions replaced by token 0 ([MASK]); labels are the
//         original tokens there and -100 elsewhere; the additive attention mask is all zeros.
//   t5:   copy task: labels = tokens, decoder input = labels shifted right (start token 0).
//   amoebanet / mlp: Gaussian noise around a per-class prototype; labels uniform.
// Each sample depends only on (seed, sample index), so any micro-batch split of a mini-batch
// sees the same samples.
#include <cstdint>

#include <ATen/ATen.h>

#include "exec/stage_module.h"
#include "graph/op_graph.h"

namespace dawnpiper {

class SyntheticData {
 public:
  SyntheticData(const OpGraph& graph, uint64_t seed);
  // Fills env with the data tensors (Input nodes' outputs) that `wanted` lists, for the
  // micro-batch whose first sample is `first_sample`.
  void load(TensorEnv& env, const std::vector<int>& wanted, int64_t first_sample,
            at::Device device) const;
  // Index of the first sample of micro-batch `micro_batch` of step `step`.
  int64_t first_sample(int64_t step, int64_t micro_batch, int64_t micro_batches) const {
    return (step * micro_batches + micro_batch) * graph_->micro_batch_size;
  }

 private:
  at::Tensor make(const std::string& name, const Shape& shape, int64_t first_sample) const;
  const OpGraph* graph_;
  uint64_t seed_;
  int64_t vocab_ = 2;    // token families: embedding rows
  int64_t classes_ = 2;  // the loss's class count
};

}  // namespace dawnpiper
