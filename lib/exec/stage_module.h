#pragma once
// StageModule: a contiguous range [begin, end) of an OpGraph's nodes with its own parameters,
// executed op by op with LibTorch autograd. The reference trainer uses the whole graph as one
// stage; the pipeline runtime gives each rank one range. Only the range's parameters are
// allocated. Parameters are initialized from (seed, owning node, parameter index) alone, or for
// imported models read from the weight files by name, so any split of the graph holds exactly
// the same weights as the whole model.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "data/tensor_env.h"
#include "graph/op_graph.h"
#include "util/seed.h"

namespace dawnpiper {

class AtenKernel;
class WeightLoader;
struct NodeInputs;

// What varies between executions of the same stage: which micro-batch this is (dropout masks
// are drawn from (seed, node, step, micro_batch), so recomputation and every pipeline schedule
// reproduce the reference trainer's masks exactly).
struct RunContext {
  int64_t step = 0;
  int64_t micro_batch = 0;
  bool eval = false;  // evaluation: dropout passes its input through
};

struct StageParameter {
  std::string name;   // "<node name>.<param name>"; imported models: the PyTorch name
  int node = -1;      // the node that owns it (for tied parameters: the owner, maybe outside)
  int index = -1;     // index in the owner's params
  at::Tensor tensor;  // leaf, requires_grad
};

class StageModule {
 public:
  StageModule(const OpGraph& graph, int begin, int end, uint64_t seed, at::Device device = at::Device(at::kCPU));
  ~StageModule();
  StageModule(StageModule&&) noexcept;

  int begin() const { return begin_; }
  int end() const { return end_; }
  const OpGraph& graph() const { return *graph_; }
  std::vector<StageParameter>& parameters() { return params_; }
  // The OpGraph::buffers the range reads (undefined where it reads none), on the stage's device.
  const std::vector<at::Tensor>& buffers() const { return buffers_; }
  const std::vector<StageParameter>& parameters() const { return params_; }
  int64_t parameter_count() const;
  // The parameters node reads (indices into parameters(): its own and tied ones).
  std::vector<int> parameters_read(int node) const;

  // A TensorEnv sized for the graph, with a slot past its tensors for each internal buffer the
  // range exposes.
  TensorEnv make_env() const { return TensorEnv(graph_->tensors.size() + static_cast<size_t>(internal_count_)); }
  // Some autograd-internal buffers are made where the module holds them, so that the evictor
  // can empty and refill their storage (profile/profile.h, exposed_internal): a dropout's mask
  // (copy_of -1), a batched matmul operand's contiguous copy (copy_of: the operand), the loss's
  // log-probabilities (-1), a max pooling's indices (-1). run_node puts them into env at this index (when env has it
  // and the node made one); forward() drops them after after_node. -1: not exposed.
  int internal_slot(int node, int copy_of) const;
  // Tensors that must be present in the env before forward(): the data inputs the range reads
  // and the activations it reads from earlier stages.
  const std::vector<int>& external_inputs() const { return external_inputs_; }
  // Activations produced inside the range that later stages read (what forward() leaves in
  // env); data tensors are never among them: every stage loads its own.
  const std::vector<int>& outputs() const { return outputs_; }

  // Runs the range's nodes. Intermediate tensors are dropped from `env` after their last use in
  // the range (autograd keeps what backward needs), so memory behaves like an ordinary module.
  // Input nodes in the range read their tensor from env (the data loader put it there).
  // before_node, when set, runs before each node (the profiler's in-step timing, the evictor's
  // bookkeeping); after_node right after it, while env still holds what the node read.
  void forward(TensorEnv& env, const RunContext& ctx, const std::function<void(int node)>& before_node = {},
               const std::function<void(int node, TensorEnv& env)>& after_node = {}) const;

  // Runs one node: reads its inputs from env and stores its output there.
  void run_node(int node, TensorEnv& env, const RunContext& ctx) const;

  at::Device device() const { return device_; }
  // Called with a parameter's index (into parameters()) before an op reads it: sharded data
  // parallelism at level 3 gathers it there (runtime/zero_shard.h).
  void set_parameter_gate(std::function<void(int param)> gate) { gate_ = std::move(gate); }

 private:
  // The constructor's parts, in order.
  void make_parameters(WeightLoader* weights);
  void find_inputs_and_releases();
  std::vector<char> prepare_nodes();
  void load_buffers(const std::vector<char>& read, WeightLoader* weights);
  at::Tensor param(int node, int index) const;
  void run_aten(const Node& node, TensorEnv& env, const RunContext& ctx) const;
  // Ops that read the stage's parameters (and the loss, which reads the precision).
  at::Tensor parametric_op(const Node& node, const NodeInputs& in) const;
  at::Tensor dropout(const Node& node, const at::Tensor& x, const RunContext& ctx, TensorEnv& env) const;
  at::Tensor matmul(const Node& node, const NodeInputs& in, TensorEnv& env) const;
  at::Tensor cross_entropy(const Node& node, const NodeInputs& in, TensorEnv& env) const;
  void expose(TensorEnv& env, int node, int copy_of, const at::Tensor& buffer) const;
  at::Tensor causal_mask(const Node& node, int64_t size) const;
  at::Tensor relative_buckets(const Node& node, int64_t sq, int64_t sk) const;

  const OpGraph* graph_;
  int begin_, end_;
  uint64_t seed_;
  at::Device device_;
  std::vector<StageParameter> params_;
  std::map<std::pair<int, int>, int> param_index_;  // (node, param) -> params_ index
  std::vector<int> external_inputs_, outputs_;
  std::vector<std::vector<int>> release_after_;  // node offset -> tensors dead after it
  // node offset -> a reshape that copies when the whole graph runs: it copies here too, even
  // where its input arrived contiguous (received), so the stage keeps the storages the
  // profile and the planner account for.
  std::vector<char> reshape_copies_;
  // node offset -> (copy_of, env index) of the internal buffers it exposes (internal_slot).
  std::vector<std::vector<std::pair<int, int>>> internal_slots_;
  int internal_count_ = 0;
  std::vector<std::string> constant_keys_;               // node offset -> OpGraph::stage_constant key
  mutable std::map<std::string, at::Tensor> constants_;  // by key
  std::vector<std::unique_ptr<AtenKernel>> kernels_;     // node offset -> imported node's call
  std::vector<at::Tensor> buffers_;                      // OpGraph::buffers the range reads
  std::function<void(int)> gate_;
};

}  // namespace dawnpiper
