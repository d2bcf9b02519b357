#pragma once
// Data for the graph's Input nodes, by each node's role (Node::role):
//   tokens       a token sequence: x[t+1] = (a * x[t] + c) mod V from a log-uniform start
//   tokens_next  the same sequence shifted by one (next-token labels)
//   dec_tokens   shifted right, start token 0 (T5's decoder input; the labels are `tokens`)
//   mlm_tokens   15% of positions replaced by the mask token (Node::ints "mask_token", default 0)
//   mlm_labels   the original tokens there, -100 elsewhere
//   zeros        an all-zero float tensor (BERT's additive padding mask)
//   prototype    Gaussian noise around a per-class prototype; `class` is that class
//   randn        N(0, 1) floats; randint: integers in [0, Node::ints "high")
// Masked-LM sequences count up (a = c = 1), others use a = 5, c = 3: both are learnable, so
// training visibly lowers the loss. The vocabulary is the node's "vocab" or the first
// embedding's rows. Each sample depends only on (seed, sample index), so any micro-batch split
// of a mini-batch sees the same samples, and every input of a sample agrees.
#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "data/tensor_env.h"
#include "graph/op_graph.h"

namespace dawnpiper {

// What fills the Input nodes' tensors: synthetic samples, or a token file (data/token_file.h).
class DataSource {
 public:
  explicit DataSource(const OpGraph& graph) : graph_(&graph) {}
  virtual ~DataSource() = default;
  // Fills env with the data tensors (Input nodes' outputs) that `wanted` lists, for the
  // micro-batch whose first sample is `first_sample`.
  virtual void load(TensorEnv& env, const std::vector<int>& wanted, int64_t first_sample, at::Device device) const = 0;
  // Index of the first sample of micro-batch `micro_batch` of step `step`.
  int64_t first_sample(int64_t step, int64_t micro_batch, int64_t micro_batches) const {
    return (step * micro_batches + micro_batch) * graph_->micro_batch_size;
  }

 protected:
  const OpGraph* graph_;
};

// Turns one sample's token window (S + 1 tokens) into the tensor of a token role; masked-LM
// roles draw their mask from `gen`. Throws ConfigError for a role that is not about tokens.
at::Tensor token_input(const Node& input, const std::vector<int64_t>& window, int64_t seq_len, at::Generator& gen);
bool is_token_role(const std::string& role);

class SyntheticData final : public DataSource {
 public:
  SyntheticData(const OpGraph& graph, uint64_t seed);
  void load(TensorEnv& env, const std::vector<int>& wanted, int64_t first_sample, at::Device device) const override;

 private:
  at::Tensor make(const Node& input, const Shape& shape, int64_t first_sample) const;
  uint64_t seed_;
  int64_t vocab_ = 2;    // token roles: embedding rows
  int64_t classes_ = 2;  // the loss's class count
};

}  // namespace dawnpiper
