#pragma once
// ZeRO level 1 (DeepSpeed's numbering) within one stage's group of data-parallel replicas: the
// stage's parameters, flattened in order, are cut into buckets of whole parameters (at least
// one, about `bucket_bytes` each), and every bucket into D equal chunks (zero-padded); replica r
// owns chunk r of every bucket. Before an update the gradients are reduce-scattered bucket by
// bucket (each replica receives the sum of its chunks, then divides by D: the mean level 0's
// allreduce gives), each replica's optimizer updates only its chunks (it holds their state
// alone: 1/D of level 0's), and the updated chunks are all-gathered back into every replica's
// parameters, bucket by bucket. The reduce-scatters stream as level 2's below, but only in the
// step's last weight pass, over the gradients its micro-batches summed: they travel while the
// pipeline drains, and the update waits for what is still under way.
//
// The fp32 master weights are the parameters themselves (the runtime keeps them in fp32 and
// casts at each use, bf16 included), so a replica's master shard is a set of views of its
// parameters ("pieces": the part of one parameter inside the replica's chunk of one bucket).
// The optimizer runs on the pieces; a piece of a parameter that decays (two or more dimensions)
// is viewed as [1, n] so that the optimizer's weight-decay grouping (train/optimizer.h:
// decays()) applies to it element for element as to its parameter.
//
// Level 2 shards the gradients too: each micro-batch's gradients are reduce-scattered bucket by
// bucket as its backward (or the weight pass W of a split backward) produces them, and each
// replica adds its own chunk of the running sum into what it sends, so that its shard of the
// gradient receives the sum over the replicas and the micro-batches so far. A bucket starts
// once autograd has accumulated every parameter in it (post-accumulate hooks) and every bucket
// before it in a fixed order (the last bucket first, as a backward produces them) has started:
// the replicas start their collectives in the same order; a bucket's chunk of the shard is
// allocated at its first start in a step, so the shard grows as the backward goes (and as it lets
// go of the activations). At most two buckets travel at once;
// a parameter's gradient lives from its accumulation until its bucket is packed. The buckets
// of `deferred` parameters (weights tied across stages, whose gradients are summed over the
// stages before the update) are reduce-scattered once per step, as at level 1.
//
// Level 3 shards the parameters too: the replica's fp32 master shard is a tensor of its own
// (the pieces view it), and a bucket's parameters view one storage of the bucket's padded size,
// which the all-gather fills and is empty but where the bucket is gathered:
// the forward gathers a bucket where a node first reads one of its parameters
// (StageModule's parameter gate) and lets it go after the last node of a run of readers (or of
// the readers of a view of them, a position embedding's slice, a transposed weight); the
// backward gathers a node's buckets where its output's gradient arrives (a hook on each output:
// the node's functions run after it) and lets a bucket go once autograd has accumulated every
// parameter in it (no function that saved one runs after its accumulation), the rest at the
// end of the micro-batch. A split backward's input pass (zero-bubble schedules) gathers as a
// backward does; nothing accumulates there, so a bucket goes once every node that gathered it in
// the pass has run its functions (a hook on each of the node's inputs: their gradient is complete
// once every function reading them ran), unless it was gathered ahead for the next reader; the
// rest at its end. Its weight pass gathers node by node again, released as in a backward. Saved tensors are the
// parameters or views of them: they share the storage, which a gather fills again before a function reads it. The
// forward gathers one reader ahead: before a node that reads parameters, its buckets' and the next reader's all-gathers
// start (non-blocking), and the parameter gate waits for its own; the next reader's travel while it computes. The
// backward gathers one reader ahead too: where a node's output gradient arrives, its buckets are gathered (waited for)
// and those of the reader before it in the stage start, the node autograd runs next that reads parameters.
//
// Gathers travel in the compute precision (`gather_type`: bf16 runs gather bf16, half the
// bytes). The runtime computes with each parameter cast to bf16 at its use, and an fp32 copy of
// a bf16 value casts back to that value, so a replica computes what level 0 computes. At levels
// 1-2 a replica's own chunk keeps its masters (the gather writes around it); at level 3 the bf16
// values land in the upper half of the bucket's fp32 storage and are widened in place when
// first waited for, so a gathered bucket takes no more memory than in fp32. A checkpoint and the
// run's end gather the fp32 masters themselves (gather_all).
//
// The collectives (runtime/replica_collectives.h) read and write the tensors themselves on the
// CPU, and on the GPUs where each replica has one of its own (NCCL, on a stream of its own: the
// packed buffers, chunks and gathered buckets lie on the device, as they lie in memory on the
// CPU, and the replay counts them alike). Replicas sharing a GPU go over MPI through host memory
// (staged): a bucket's gradients are packed into a host buffer, its reduce-scatter lands in host
// memory and is copied into the device's chunk where waited for, a level-3 gather lands in host
// memory (in the gather type) and is copied into the bucket's device storage, widened to fp32 on
// the way, where waited for, and levels 1-2's gathers pack and unpack host buffers. The device
// then holds less than on the CPU (no packed buffer, no bf16 upper half), which the replay,
// counting the CPU's, over-predicts. DAWNPIPER_ZERO_STAGED=1 stages on the CPU too, where the
// tests check that path (bitwise the same losses). Every call is collective over the replicas,
// in the same order on every replica.
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "runtime/replica_collectives.h"

namespace dawnpiper {

// Where each replica's elements lie: pure arithmetic over the parameters' sizes.
struct ShardLayout {
  struct Bucket {
    int64_t begin = 0, numel = 0;           // in the flat parameter space
    int64_t chunk = 0;                      // ceil(numel / replicas): each replica's share, padded
    int64_t shard_offset = 0;               // where this bucket's chunk starts in a replica's shard
    size_t first_param = 0, end_param = 0;  // the parameters inside it, [first, end)
  };
  struct Piece {
    size_t param = 0;    // index into the parameters
    int64_t offset = 0;  // first element within the parameter (flattened)
    int64_t numel = 0;
    int64_t shard_offset = 0;  // where it lies in the replica's shard
    size_t bucket = 0;         // the bucket it lies in
  };
  std::vector<int64_t> param_offset;  // per parameter, in the flat space
  std::vector<Bucket> buckets;
  std::vector<Piece> pieces;  // of `replica`, in flat order
  int64_t shard_numel = 0;    // the replica's shard with its padding: the sum of the chunks
  int replicas = 1, replica = 0;
};
// Buckets hold whole parameters, closed once they reach `bucket_numel` elements (a larger
// parameter is a bucket alone); with `groups` (per parameter, e.g. its node), only between two
// groups, so that a group's parameters share a bucket.
ShardLayout shard_layout(const std::vector<int64_t>& param_numels, int64_t bucket_numel, int replicas, int replica,
                         const std::vector<int>& groups = {});

// The `n` bf16 values that an all-gather wrote into the upper half of `storage` (the bytes of `n`
// fp32 elements: a level-3 bucket's) become those fp32 elements, in place, on `device`.
void widen_bf16_in_place(const c10::Storage& storage, int64_t n, c10::Device device);

class ZeroShard {
 public:
  // `params`: the stage's fp32 master parameters (contiguous), `counted`: which count in the
  // global gradient norm (each tied parameter on its owner's stage only).
  // `level`: 1, 2 or 3; `deferred` (per parameter, empty: none): whose buckets are
  // reduce-scattered at the update; `nodes` (per parameter): buckets close only between two
  // nodes' parameters (a node's gradients come together; the planner's replay counts so).
  // `reads` (level 3, per node of the stage): the parameters it reads, in stage order.
  // `gather_type`: the compute precision, in which the parameters travel (kFloat or kBFloat16).
  ZeroShard(std::vector<at::Tensor> params, std::vector<bool> counted, MPI_Comm replicas, int64_t bucket_bytes,
            int level = 1, std::vector<bool> deferred = {}, const std::vector<int>& nodes = {},
            const std::vector<std::vector<int>>& reads = {}, at::ScalarType gather_type = at::kFloat);
  ~ZeroShard();
  ZeroShard(const ZeroShard&) = delete;
  ZeroShard& operator=(const ZeroShard&) = delete;
  int level() const { return level_; }
  bool staged() const { return staged_; }                           // the collectives go through host memory
  std::string collectives() const { return collectives_->name(); }  // "mpi" | "nccl"
  // A reduce-scatter's time in flight: bucket `bucket` of `bytes` from its start until it was seen
  // complete (by the tests between accumulations, else where waited for).
  using Clock = std::chrono::steady_clock;
  using Listener = std::function<void(int bucket, int64_t bytes, Clock::time_point start, Clock::time_point end)>;
  void set_listener(Listener listener) { listener_ = std::move(listener); }

  // The views the replica's optimizer updates (make_optimizer over them).
  const std::vector<at::Tensor>& pieces() const { return pieces_; }
  const ShardLayout& layout() const { return layout_; }

  // Collective: the parameters' gradients (zeros where undefined) reduce-scattered into the
  // pieces' gradients as the mean over the replicas; the parameters' own gradients are released
  // bucket by bucket. Only the buckets that did not stream (the deferred ones, and level 1's
  // where the step had no last weight pass: async), whose sums join the shard's; the streamed ones
  // still travelling complete. Returns the bytes this replica sent since the last update.
  int64_t reduce_scatter();
  // A weight pass (B, or W of a split backward) begins; `last`: the step's last, in which level 1
  // streams.
  void begin_pass(bool last);
  // Collective, after each weight pass where it streams (level 2: every one; level 1: the step's
  // last): the streamed buckets not yet started start now (zeros for parameters without a
  // gradient), and a bucket a parameter of which accumulated again after its start goes again.
  // Level 2: every one completes; level 1: the last two travel on until the update.
  void end_micro_batch();
  // Autograd accumulated parameter `param`'s gradient (its hook).
  void accumulated(size_t param);
  // Collective: the squared gradient norm of the counted parameters over every replica's shard
  // (the pieces' gradients), summed in double, as level 0 computes it on whole gradients.
  double grad_square_sum() const;
  // Collective: every replica's updated pieces into every replica's parameters, in the gather
  // type. Level 3: nothing (each use gathers).
  void all_gather();
  // The bytes this replica received in all-gathers since the last call (every level's).
  int64_t take_gathered_bytes() { return std::exchange(gathered_bytes_, 0); }

  // Level 3, each collective where it gathers (every replica runs the same program, so they
  // gather in the same order). Parameter `param` is about to be read.
  void gather_param(size_t param);
  // The buckets node `node` (offset in the stage) reads: its parameters', and those that
  // `inputs` view (a parameter's slice or transpose an earlier node made).
  std::vector<size_t> buckets_read(size_t node, const std::vector<at::Tensor>& inputs) const;
  // The backward is about to run node `node`'s functions, which read `buckets` (its output
  // gradient came): they are gathered, and the all-gathers of the reader before it start.
  void before_backward_node(size_t node, const std::vector<size_t>& buckets);
  // A split backward's input pass begins / ends (the end lets every bucket go).
  void begin_input_pass();
  void end_input_pass();
  // In an input pass: a gradient of node `node`'s inputs is complete, so its functions, which
  // read `buckets`, ran.
  void inputs_gradient_made(size_t node, const std::vector<size_t>& buckets);
  // A forward is about to run node `node` (past the last: its end): the buckets that neither the
  // next node reading parameters reads (nor, where `node` reads them, the reader after it) nor a
  // tensor of `env` views go; where `node` reads parameters, its buckets' all-gathers and the
  // next reader's start.
  void before_forward_node(size_t node, const std::vector<at::Tensor>& env);
  // Level 3: whether `t` views a gathered bucket (a transposed weight the stage sends: it is sent
  // as a copy, and its buckets go once the copy is made: let_go_viewed).
  bool views_gathered(const at::Tensor& t) const;
  void let_go_viewed(const std::vector<at::Tensor>& tensors);
  // Every parameter whole and equal to its fp32 masters (a checkpoint, the run's end): level 3
  // gathers every bucket in fp32, levels 1-2 gather their chunks again where they travelled in
  // bf16. release_all lets every gathered bucket go; below level 3 it and keep_parameters do
  // nothing.
  void gather_all();
  void release_all();
  // After the parameters were overwritten (a checkpoint read into them, gathered): the shard
  // takes its chunks from them.
  void keep_parameters();

 private:
  std::vector<at::Tensor> params_, pieces_;
  c10::Device device_ = at::kCPU;  // the parameters'
  bool staged_ = false;            // the collectives go through host memory (parameters on a GPU)
  at::TensorOptions on_device() const { return at::TensorOptions(at::kFloat).device(device_); }
  std::vector<bool> piece_counted_;
  MPI_Comm comm_;
  std::unique_ptr<ReplicaCollectives> collectives_;  // (before the collectives under way: outlives them)
  ShardLayout layout_;
  // Per bucket, this replica's chunk of the summed gradient: from the bucket's first reduction
  // in a step until the update; the pieces' gradients view them. Each is allocated as its bucket
  // first starts, so the shard grows as the backward goes.
  std::vector<at::Tensor> chunk_grad_;
  int level_ = 1;
  at::ScalarType gather_type_ = at::kFloat;
  int64_t sent_bytes_ = 0;      // since the last update
  int64_t gathered_bytes_ = 0;  // since take_gathered_bytes
  // Levels 1-2: every replica's chunks into the parameters in `type`, this replica's own left.
  void gather_chunks(at::ScalarType type);

  // Level 3.
  at::Tensor shard_;                                // the replica's fp32 masters, padded
  std::vector<c10::Storage> bucket_storage_;        // per bucket: its parameters' storage, empty but gathered
  std::vector<std::vector<size_t>> node_buckets_;   // per node offset: the buckets it reads
  std::vector<int> next_reader_, previous_reader_;  // per node offset: the next / previous node reading parameters, -1
  std::vector<char> gathered_, released_on_;        // per bucket / per parameter (accumulated this micro-batch)
  std::vector<char> narrow_;                        // per bucket: gathered in bf16, not yet widened
  std::vector<std::unique_ptr<ReplicaCollective>> gathering_;  // per bucket: its all-gather while under way
  std::vector<at::Tensor> landing_;                            // per bucket, staged: the host memory it gathers into
  std::vector<int> unaccumulated_;                             // per bucket: its parameters not yet accumulated
  // An input pass: per node offset 0 (not gathered in it), 1 (gathered, not run), 2 (ran); per
  // bucket the nodes gathered in it and not yet run; the reader last gathered ahead.
  bool input_pass_ = false;
  std::vector<char> input_pass_node_;
  std::vector<int> input_pass_readers_;
  int ahead_reader_ = -1;
  void start_gather(size_t bucket, at::ScalarType type);  // its all-gather under way (gathering_)
  void gather(size_t bucket);                             // started if not (in the gather type), and complete
  void test_gathers();                                    // MPI advances the gathers under way
  void release(size_t bucket);
  void stream_buckets(const std::vector<bool>& deferred);              // level 2's set-up
  void gather_where_read(const std::vector<std::vector<int>>& reads);  // level 3's
  void count_parameters();                                             // unaccumulated_ for a new micro-batch
  bool hooked(size_t param) const;                                     // told when autograd accumulates it
  bool views(const at::Tensor& t, size_t bucket) const;                // t lies in the bucket's storage

  // One weight pass's streaming (level 2: every one; level 1: the step's last).
  struct Travelling {
    at::Tensor buffer, chunk;  // what it sends, where it lands
    at::Tensor landing;        // where MPI receives it: chunk, or (staged) host memory
    std::unique_ptr<ReplicaCollective> request;
    size_t bucket;
    Clock::time_point start, end;  // end: once seen complete
    bool landed;                   // in chunk
  };
  // Packs bucket b's gradients (releasing them) and starts its reduce-scatter into the shard,
  // this replica's sum so far in the step added into its own chunk first.
  void start(size_t bucket);
  void finish_oldest();
  void test_travelling();    // MPI advances the reductions under way
  void wait(Travelling& t);  // seen complete
  void land(Travelling& t);  // complete and in its chunk
  Listener listener_;
  void restart_streaming();                    // the counts for the next pass
  bool armed_ = false;                         // streaming in this pass
  std::vector<int> bucket_of_;                 // per parameter: its bucket, -1: none (no elements)
  std::vector<char> deferred_;                 // per bucket
  std::vector<size_t> order_;                  // the streamed buckets, in the order they start
  std::vector<int> waiting_;                   // per bucket: its parameters with elements not yet accumulated
  std::vector<char> ready_, started_, again_;  // per parameter / bucket / bucket
  size_t next_ = 0;                            // into order_: the next bucket to start
  std::deque<Travelling> travelling_;
};

}  // namespace dawnpiper
