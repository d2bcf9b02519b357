#pragma once
// Evictor: carries out a plan's per-tensor memory decisions on one stage while it trains.
//
// It executes the stage program's evictions (plan/stage_program.h says where each happens). After
// the tensor's last forward use in the stage (or, when it is also sent downstream, once it is
// sent) its storage is emptied in place: autograd's saved copies share the StorageImpl, so they lose
// the data too and the allocator gets the bytes back. Before the backward of the node that first
// reads it (Eviction::restore_before; autograd function pre-hooks find that moment), the
// data comes back into the same StorageImpl, so autograd never notices (no copy_ into the saved
// tensor, no version-counter bump):
//   swap       the bytes go to host memory the device allocator does not charge (SwapCopier: on
//              CPU plain malloc, invisible to the counting allocator; on CUDA pinned memory, on a
//              side stream) and are copied back, starting at the backward of
//              Eviction::prefetch_at so that the copy hides behind the nodes after it;
//   recompute  the bytes are dropped; the producer is re-run (and, recursively, the producers of
//              its inputs that are not on the device either, as the planner's recompute chains
//              assume) from inputs held since the forward, with grad mode on as in the forward so
//              that the same kernels run, and with the micro-batch's RunContext so that dropout
//              draws the same mask: the rebuilt bytes are identical.
// Autograd-internal buffers the module holds (StageModule::internal_slot: dropout masks, matmul
// operand copies, the loss's log-probabilities, pooling indices) are evicted the same way, found in the env's
// slots past the graph's tensors; recomputing one re-runs the node that makes it.
// One instance serves every micro-batch in flight (and every weight version: recomputation
// uses the weights the caller installed in the module, which PipelineStage sets to the
// micro-batch's stashed version).
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "exec/stage_module.h"
#include "plan/plan.h"
#include "runtime/swap_copier.h"
#include "schedule/action.h"

namespace dawnpiper {

class Evictor {
 public:
  using Clock = std::chrono::steady_clock;
  // (kind SwapOut | SwapIn | Recompute, micro-batch, tensor, bytes, start, end)
  using Listener = std::function<void(ActionKind, int64_t, int, int64_t, Clock::time_point, Clock::time_point)>;

  // `evictions`: the stage program's (plan/stage_program.h), placed by the planner. Throws
  // ConfigError when one does not fit the stage's graph (a tensor outside it, a node outside the
  // stage's range: a program for another stage or model).
  Evictor(const StageModule& module, const std::vector<Eviction>& evictions);

  bool active() const { return !entries_.empty(); }
  void set_listener(Listener listener) { listener_ = std::move(listener); }

  // The forward of micro-batch mb: begin_forward with the env holding the stage's inputs, then
  // before_node / after_node as StageModule::forward's hooks.
  void begin_forward(int64_t mb, const RunContext& ctx, const TensorEnv& env);
  void before_node(int64_t mb, int node);
  void after_node(int64_t mb, int node, TensorEnv& env);
  // Tensors sent downstream are evicted after the send: the sender must send copies of those
  // (transports may send from the tensor's own storage after send() returns).
  bool evicts_after_send() const { return !sent_entries_.empty(); }
  void after_send(int64_t mb);
  // Hooks the micro-batch's autograd functions (reachable from `roots`) so that each evicted
  // tensor comes back before the first function that may read it.
  void before_backward(int64_t mb, const std::vector<at::Tensor>& roots);
  // Forgets the micro-batch (host copies of tensors no backward read are freed).
  void after_backward(int64_t mb);

  // The restore a pre-hook of a function created by `node` triggers (public for the hook).
  void restore_for(int64_t mb, int node);

  // How the swaps' copies back met the compute stream so far (SwapCopier::waits; none without swaps).
  SwapCopier::Waits swap_waits() const { return copier_ ? copier_->waits() : SwapCopier::Waits{}; }

 private:
  struct Held {
    at::Tensor tensor;              // a detached alias of the evicted tensor (same StorageImpl)
    c10::DataPtr host;              // swap: the bytes while evicted
    SwapCopier::Incoming incoming;  // swap: the copy back, once started
    int64_t bytes = 0;
    bool evicted = false;
    bool arriving = false;  // swap: the copy back has started
  };
  struct MicroBatch {
    RunContext ctx;
    std::vector<uint64_t> node_seq;    // autograd sequence number before each node
    std::map<int, at::Tensor> leaves;  // inputs pending recomputations read
    std::map<int, Held> held;          // entry index -> evicted tensor
  };

  void pick_up(MicroBatch& m, int entry, const TensorEnv& env);
  void evict(MicroBatch& m, int entry, const at::Tensor& tensor);
  void start_swap_in(int64_t mb, MicroBatch& m, int entry);
  void finish_swap_in(MicroBatch& m, int entry);
  void recompute(int64_t mb, MicroBatch& m, const std::vector<int>& entries);
  void emit(ActionKind kind, int64_t mb, int tensor, int64_t bytes, Clock::time_point start);

  const StageModule& module_;
  const OpGraph& graph_;
  std::vector<Eviction> entries_;
  // Per entry: where its tensor is in the forward's env (an internal buffer's slot past the
  // graph's tensors, StageModule::internal_slot), the node that makes it, its name for errors.
  std::vector<int> slot_, producer_;
  std::vector<std::string> name_;
  std::vector<std::vector<int>> evict_after_;  // node offset -> entries
  std::vector<int> sent_entries_;
  std::vector<std::vector<int>> leaves_of_node_;  // node offset -> leaf tensors it produces
  std::vector<int> external_leaves_;
  // Entries to pick up where their tensor appears (the stage keeps a tensor in its env only
  // until its last direct reader; readers of its views come later): node offset -> entries, and
  // those of data and received tensors, present from the forward's start.
  std::vector<std::vector<int>> pickup_after_;
  std::vector<int> external_pickups_;
  std::map<int64_t, MicroBatch> mbs_;
  std::unique_ptr<SwapCopier> copier_;  // when some entry swaps
  Listener listener_;
};

}  // namespace dawnpiper
