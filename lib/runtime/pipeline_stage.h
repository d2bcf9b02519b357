#pragma once
// PipelineStage: what one rank computes. It owns a StageModule (only its node range's
// parameters), its optimizer, and the per-micro-batch state between a forward and its backward,
// and executes schedule actions one at a time. The order comes from the schedule
// (schedule/schedule.h); the planner simulated the same lists.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "data/synthetic.h"
#include "data/token_file.h"
#include "exec/split_backward.h"
#include "exec/stage_module.h"
#include "plan/plan.h"
#include "plan/stage_program.h"
#include "runtime/evictor.h"
#include "runtime/transport.h"
#include "runtime/zero_shard.h"
#include "schedule/action.h"
#include "schedule/interpreter.h"
#include "schedule/schedule.h"
#include "train/optimizer.h"

namespace dawnpiper {

// What every stage of a run shares (PipelineConfig holds it once; each StageConfig its stage's).
struct StageSettings {
  ScheduleChoice schedule = ScheduleChoice::named("1f1b");
  int64_t micro_batches = 1;  // per step (sync) / per reported step (async)
  uint64_t seed = 42;
  OptimizerConfig optimizer;
  at::Device device = at::Device(at::kCPU);  // where the stages' parameters and activations live
  DataConfig data;                           // synthetic, or a token file
  // Data parallelism: this pipeline is replica `replica` of `replicas`. Its micro-batch k is
  // micro-batch k * replicas + replica of the whole job (its samples and its dropout masks), so
  // D replicas of m micro-batches train what one pipeline of D x m micro-batches would.
  int replica = 0, replicas = 1;
};

// One stage of a run: the shared settings and the stage's program, made as the planner makes its
// (plan/stage_program.h): its node range, one step's actions and the plan's evictions, which an
// Evictor carries out. Where its backwards split into I and W, its forwards record what the
// weight pass starts from (exec/split_backward.h).
struct StageConfig : StageSettings {
  int stages = 1;
  StageProgram program;
};

// Throws ConfigError for clipping under async: its stages update on their own, so no norm spans
// a step's gradients.
void check_grad_clip(const ScheduleChoice& schedule, double grad_clip);

// Sums gradients of parameters that several stages hold copies of (weights tied across the
// cut, e.g. GPT-2's embedding and output projection). Called with the stage's copies at a
// ReduceTiedGrads action; the default does nothing (no ties, or one process).
using TiedGradReducer = std::function<void(std::vector<StageParameter>&)>;

class PipelineStage : private ActionHooks {
 public:
  PipelineStage(const OpGraph& graph, const StageConfig& config, Transport& transport);

  // Executes one action of this stage's list. Returns the finished step's mean loss (last
  // stage only, after the step's last backward) through on_loss. Errors are rethrown with the
  // stage and the action in front of the cause ("stage 2, action 2B5: out of memory: ...").
  void execute(const Action& action);
  void set_loss_callback(std::function<void(int64_t step, double loss)> on_loss) { on_loss_ = std::move(on_loss); }
  void set_tied_reducer(TiedGradReducer reducer) { reduce_tied_ = std::move(reducer); }
  // The squared gradient norm summed over the pipeline's stages (computing this stage's too),
  // before every update of a synchronous schedule (the global norm clipping and the report use);
  // the default: this stage alone.
  void set_norm_reducer(std::function<double()> reducer) { reduce_norm_ = std::move(reducer); }
  // Averages the stage's gradients over the data-parallel replicas before every optimizer step
  // (every schedule; under async, each replica's k-th update averages their k-th gradients).
  void set_replica_reducer(TiedGradReducer reducer) { reduce_replicas_ = std::move(reducer); }
  // Synchronous schedules: called where the stage's last backward of a step has produced its
  // weight gradients, to start their averaging (ReplicaAverager::start); the replica reducer
  // then completes it.
  void set_replica_starter(TiedGradReducer starter) { start_replicas_ = std::move(starter); }
  // Called as each weight pass (B, or W of a split backward) begins, `last` where it is the
  // step's last of a synchronous schedule (ReplicaAverager::begin_pass).
  void set_replica_pass(std::function<void(bool last)> begins) { begin_replica_pass_ = std::move(begins); }
  // Averages the gradients over the replicas now, once per update (which then does not): a rank
  // of several stages needs all of them averaged before its first update takes the norm.
  void average_replicas();
  // ZeRO level 1, 2 or 3 over `replicas` (this stage's replicas, rank = replica;
  // runtime/zero_shard.h): the optimizer is rebuilt over this replica's shard, the replica
  // reducer then reduce-scatters (level 2: what no micro-batch streamed: the `deferred`
  // parameters, tied across stages), the norm sums every replica's shard, and each update ends
  // with the all-gather. Level 2 streams each micro-batch's gradients into the shard as its
  // weight gradients come. Level 3 gathers the parameters where they are read and lets them go
  // (runtime/zero_shard.h). Before the first backward (and before a checkpoint is read).
  void shard_optimizer(MPI_Comm replicas, int64_t bucket_bytes, int level = 1, std::vector<bool> deferred = {});
  ZeroShard* zero_shard() { return zero_.get(); }
  // Forward only, without autograd or dropout, of validation micro-batch `index` (its samples
  // from the validation split): received from the previous stage and sent to the next under
  // message id `id` (apart from every training micro-batch's). Returns the loss on the last
  // stage, 0 elsewhere. Every stage calls it for the same ids in the same order.
  double evaluate(int64_t id, int64_t index);

  StageModule& module() { return module_; }
  Optimizer& optimizer() { return *optimizer_; }
  // Null when the plan evicts nothing on this stage.
  Evictor* evictor() { return evictor_.get(); }
  const StageConfig& config() const { return config_; }
  bool is_last() const { return config_.program.stage == config_.stages - 1; }
  int weight_versions() const;
  // The squared norm of the gradients this stage counts in the global norm: each tied parameter
  // on the stage that owns it only.
  double grad_square_sum() const;
  // The global gradient norm before clipping of the latest update (NaN under async, which
  // has no step-wide norm).
  double last_grad_norm() const { return last_grad_norm_; }

 private:
  struct InFlight {
    std::vector<at::Tensor> inputs;   // received activations (leaves), graph order of recv_ids_
    std::vector<at::Tensor> outputs;  // this stage's crossing outputs, with their graphs
    at::Tensor loss;                  // last stage
    int64_t version = 0;              // weight version the forward used (async)
    WeightRoots weight_roots;         // split backward: from the forward until W
    bool weights_pending = false;     // I ran, W not yet: the graph stays after the gradients are sent
    bool inputs_sent = false;         // ... and they were
  };

  // The list's actions (schedule/interpreter.h).
  void forward(const Action& a) override { forward(a.micro_batch); }
  void backward(const Action& a) override { backward(a.micro_batch); }
  void backward_input(const Action& a) override { backward_input(a.micro_batch); }
  void backward_weight(const Action& a) override { backward_weight(a.micro_batch); }
  void recv_activation(const Action& a) override { receive_activations(a.micro_batch); }
  void send_activation(const Action& a) override { send_activations(a.micro_batch); }
  void recv_grad(const Action& a) override { receive_gradients(a.micro_batch); }
  void send_grad(const Action& a) override { send_gradients(a.micro_batch); }
  void optimizer_step(const Action&) override { optimizer_step(); }
  void reduce_tied_grads(const Action&) override {
    if (reduce_tied_) reduce_tied_(module_.parameters());
  }
  void runtime_action(const Action& a) override;  // never in a list: the evictor runs them
  void receive_activations(int64_t mb);
  void send_activations(int64_t mb);   // copies where the evictor empties sent storages next
  void send_gradients(int64_t mb);     // the micro-batch is then done on this stage
  void receive_gradients(int64_t mb);  // kept until Backward, as the outputs' pending gradients
  void forward(int64_t mb);
  void backward(int64_t mb);
  void backward_input(int64_t mb);
  void backward_weight(int64_t mb);
  // What the backward starts from: the stage's outputs that autograd tracks with their received
  // gradients, or on the last stage the scaled loss (with 1).
  void backward_roots(InFlight& f, std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& grads);
  void count_loss(int64_t mb);  // the last stage: reports the step's loss after its last backward
  void optimizer_step();
  void weight_pass_done();  // after a micro-batch's weight gradients (B, or W of a split backward)
  void weight_pass_begins();
  // ZeRO level 3, after a forward ran node n: its outputs gather what it read (parameters or
  // views of them) for its backward.
  void sharded_node_ran(int n, TensorEnv& env);
  int64_t step_of(int64_t mb) const { return mb / config_.micro_batches; }
  int64_t job_micro_batch(int64_t mb) const { return mb * config_.replicas + config_.replica; }
  std::vector<at::Tensor>& version_tensors(int64_t version);

  const OpGraph& graph_;
  StageConfig config_;
  Transport& transport_;
  StageModule module_;
  std::unique_ptr<DataSource> data_, validation_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<ZeroShard> zero_;  // ZeRO level 1-3: optimizer_ runs over its pieces
  std::unique_ptr<Evictor> evictor_;
  std::unique_ptr<SplitBackward> split_;  // when the list holds I and W
  std::vector<int> recv_ids_, send_ids_, data_ids_;
  std::vector<const TensorInfo*> recv_specs_, grad_specs_;
  std::vector<bool> recv_requires_grad_, send_requires_grad_;
  std::vector<bool> recv_relayed_only_;  // received tensors no node of the stage reads
  std::map<int64_t, InFlight> in_flight_;
  // Async weight stashing: the master weights are the optimizer's; a forward uses a snapshot
  // of the current version, kept until the last micro-batch that used it has run backward.
  int64_t version_ = 0;
  std::map<int64_t, std::vector<at::Tensor>> stash_;
  std::map<int64_t, int> stash_users_;
  std::vector<at::Tensor> masters_;
  std::vector<bool> counted_in_norm_;  // per master
  double last_grad_norm_;
  int64_t latest_step_ = 0;  // of the latest backward: the step an update belongs to
  // The step's (micro-batch, loss) so far, read together after its last backward.
  std::vector<std::pair<int64_t, at::Tensor>> step_losses_;
  std::function<void(int64_t, double)> on_loss_;
  TiedGradReducer reduce_tied_, reduce_replicas_, start_replicas_;
  std::function<void(bool)> begin_replica_pass_;
  int64_t weight_passes_ = 0;       // of the step so far
  bool replicas_averaged_ = false;  // since the last update
  std::function<double()> reduce_norm_;
};

}  // namespace dawnpiper
