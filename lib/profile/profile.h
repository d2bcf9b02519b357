#pragma once
// Profile: what the planner knows about a model, per node of its OpGraph. Pure C++ (no LibTorch).
// Produced by the profiler (measured, lib/profile) or from shapes and a device spec (analytic);
// stored in HDF5 (profile_io.h). Times in milliseconds, sizes in bytes, all for ONE micro-batch
// of `micro_batch_size` samples; `at_batch(B)` re-evaluates the batch-size fits for another B.
#include <cstdint>
#include <string>
#include <vector>

#include "profile/host_link.h"
#include "train/optimizer_kind.h"
#include "util/dtype.h"

namespace dawnpiper {

// value(B) = base + per_sample * B, fitted over the profiled batch sizes.
struct LinearFit {
  double base = 0;
  double per_sample = 0;
  double at(int64_t batch) const { return base + per_sample * static_cast<double>(batch); }
};

struct TensorProfile {
  int id = -1;  // OpGraph tensor id; ids past the graph's are internal buffers
  std::string name;
  int producer = -1;           // node id
  std::vector<int> consumers;  // node ids (forward data flow)
  bool is_data = false;        // produced by an Input node: loaded by each stage, never sent
  LinearFit bytes_fit;
  int64_t bytes = 0;  // at micro_batch_size
  // Nodes whose backward reads this tensor (autograd saved it). Non-empty means the tensor is
  // an activation that lives from its forward production until the last of these backwards:
  // the candidates for swap and recompute.
  std::vector<int> saved_by;
  // An autograd-internal buffer (dropout mask, normalization statistics, pooling indices, the
  // loss's log-softmax): no OpGraph tensor, no consumers, saved by its producer only. It counts
  // as activation memory; only those the executor holds (exposed_internal) are swap/recompute
  // candidates.
  bool internal = false;
  // An internal buffer that is a contiguous copy of this input of its producer (a batched
  // matmul's operand whose layout does not fold): a stage that receives that input gets it
  // contiguous, makes no copy and keeps the received tensor instead. -1 otherwise.
  int copy_of = -1;
  // The tensor whose storage this one shares (a view: transpose, a reshape of a contiguous
  // tensor), -1 if it owns its storage. Views allocate nothing; when a backward saves a view,
  // saved_by is recorded on the storage owner, the tensor whose memory stays alive.
  int alias_of = -1;
  // A view of a parameter (GPT-2's position table sliced to the sequence): allocates nothing.
  bool param_view = false;
  // Whether autograd tracks it (gradients flow through it): 1/0, or -1 where the profile does
  // not say (older files: the replays derive it from parameters).
  int requires_grad = -1;
  // Whether its layout is contiguous (1/0; -1 unknown): a transport sends a non-contiguous
  // tensor as a contiguous copy.
  int contiguous = -1;
  // Whether a stage receiving it lays it out again in the whole graph's dimension order
  // (graph/layout.h receipt_layout: a transposed view, of a whole tensor or of a slice), so that
  // a matmul's operand copy of it is made there too (1/0; -1 unknown: older files).
  int relaid_on_receipt = -1;
  bool owns_storage() const { return alias_of < 0 && !param_view; }
};

// How the replays treat a node. node_class() reads it from the kind (NodeProfile::kind: a zoo kind,
// or the ATen operator of an imported node, "aten::transpose.int"), the one place kinds are
// compared as text; the cost model keeps a node's class.
enum class NodeClass : char {
  Other,
  Input,    // a data placeholder: loaded by each stage, no gradient
  Permute,  // its gradient is a permuted view (reshaping it copies)
  Reshape,  // copies a permuted gradient
  // A view whose backward allocates a gradient of the input's size (a slice scatters into zeros,
  // an expand sums, a split concatenates) rather than viewing the output's gradient.
  ViewAllocatingGradient,
  // Writes its input's gradient over its output's gradient when the stage made that one and no
  // view of it exists (the zoo's softmax: exec/lean_ops.h).
  InPlaceGradient,
  // The zoo's cross-entropy (exec/cross_entropy.h): in fp32 its log-probabilities take the
  // logits' storage where the logits die there (one chunk of rows more, not a second buffer),
  // and its backward writes the logits' gradient over them.
  InPlaceLoss,
  Concat,  // the zoo's concat, aten::cat and aten::stack (any overload): its backward hands out slices
  // Its weight's gradient reaches the weight as a view (of the transposed product), which
  // autograd does not sum another gradient into: a sum with it is a buffer of its own.
  Linear,
};
NodeClass node_class(const std::string& kind);
// Whether a node of this kind was imported (an ATen operator, "aten::matmul"): only imported
// graphs carry the export's layouts, which a stage receiving a permuted view lays out again.
bool imported_kind(const std::string& kind);
struct Profile;
// Whether the executor keeps a handle on internal buffer `t` (exec/stage_module.cpp), so that
// the evictor can swap or recompute it like a graph tensor: a zoo dropout's mask, a zoo
// matmul's contiguous operand copy, a zoo loss's log-probabilities, a zoo max pooling's indices.
// Other internal buffers (normalization statistics, imported operators' buffers) stay on the
// device.
bool exposed_internal(const Profile& profile, const TensorProfile& t);

// A NodeClass::InPlaceLoss node's inputs (`inputs`: its input tensor ids): the labels are the
// one its backward saved (itself or, for a view, its storage's owner), the logits the other. -1
// where the profile does not show that. fp32: the logits take as many bytes as their fp32
// log-probabilities (the node's internal buffer) and are not known to be strided, so the
// executor may write over them (exec/stage_module.cpp).
struct LossInputs {
  int logits = -1, labels = -1;
  bool fp32 = false;
};
LossInputs loss_inputs(const Profile& profile, int node, const std::vector<int>& inputs);

struct NodeProfile {
  int id = -1;
  std::string name;
  std::string kind;  // op_kind_name(), or the ATen operator of an imported node
  int block = 0;     // OpGraph block index (layer / cell)
  int depth = 0;     // longest path from the inputs
  LinearFit fwd_ms_fit, bwd_ms_fit;
  double fwd_ms = 0, bwd_ms = 0;          // mean at micro_batch_size
  double fwd_ms_std = 0, bwd_ms_std = 0;  // spread over the measured iterations
  int64_t param_bytes = 0;                // owned parameters; gradients are the same size
  // Bytes of parameter gradients first created by this node's backward: its own parameters,
  // except that a tied parameter's gradient appears at its last user in execution order.
  int64_t param_grad_bytes = 0;
  // A parameter this node reads that node `tied_owner` owns (weight tying, e.g. GPT-2's output
  // projection reading the token embedding): a stage holding this node but not the owner holds a
  // copy of `tied_bytes`. -1 / 0 when the node reads no other node's parameter.
  int tied_owner = -1;
  int64_t tied_bytes = 0;
  // A constant the stage holding this node computes once and keeps (OpGraph::stage_constant):
  // nodes with equal keys share it. Independent of the batch size.
  std::string constant_key;
  int64_t constant_bytes = 0;
  LinearFit fwd_workspace_fit, bwd_workspace_fit;
  // Transient bytes: the peak during the node's forward (backward) minus what is still
  // allocated after it (forward: output and internal buffers; backward: the gradients of its
  // inputs and parameters).
  int64_t fwd_workspace = 0;
  int64_t bwd_workspace = 0;
  // The transient bytes of the node's part of a split backward's I (zero-bubble schedules): its
  // backward run as I runs it, the graph kept and only its tracked inputs' gradients made
  // (none for a node reading no tracked input), minus those. Differs from bwd_workspace where
  // the node is several autograd functions (CPU attention with dropout: its math path), whose
  // saved tensors a whole backward frees as it goes and I keeps until its end. -1: not measured
  // (analytic profiles, older files, nodes without a backward). The stage replay charges a
  // backward, whole or I, the larger of the two (plan/stage_replay_walk.cpp).
  int64_t bwd_input_workspace = -1;
  LinearFit bwd_input_workspace_fit{-1, 0};
  // Its backward hands the output's gradient itself to every tracked input (an add, a clone):
  // one buffer for all of them, as measured (the stage replay's grad_owner). False where not
  // measured (analytic profiles, older files): a buffer each, an overestimate.
  bool passes_gradient = false;
  // The micro-batch size (maybe fractional) from which the workspace stops growing: a fused LM
  // loss (OpGraph's LinearCrossEntropy) holds one chunk of positions at a time. at_batch
  // evaluates the workspace fits at no larger a size. 0: it grows with the batch.
  double workspace_full_at = 0;
  std::vector<int> outputs;  // tensor ids
  std::vector<int> saved;    // tensor ids this node's backward reads
  // Re-running the node's forward to rebuild its output (for recompute); usually == fwd_ms.
  double recompute_ms = 0;
  // The part of bwd_ms that a split backward's W takes (the parameters' gradients, zero-bubble
  // schedules), measured in the profiled step; -1: not measured (weight_share() estimates it).
  double weight_share = -1;
};
// NodeProfile::bwd_input_workspace where measured, else bwd_workspace.
inline int64_t input_workspace(const NodeProfile& node) {
  return node.bwd_input_workspace >= 0 ? node.bwd_input_workspace : node.bwd_workspace;
}
// NodeProfile::weight_share where measured; else half for a node reading parameters (a
// product's weight gradient is half its backward's FLOPs), 0 for one reading none.
double weight_share(const NodeProfile& node);

// Where a profile's numbers come from: the device itself, or formulas over a device spec.
enum class ProfileSource { Measured, Analytic };
template <>
struct EnumNames<ProfileSource> {
  static constexpr const char* what = "profile source";
  static constexpr std::array<std::pair<ProfileSource, const char*>, 2> table{
      {{ProfileSource::Measured, "measured"}, {ProfileSource::Analytic, "analytic"}}};
};

// One optimizer update of all a graph's parameters (fp32 masters, weight decay on matrices, the
// gradient norm before it), in ms, per optimizer; 0: not known (older files), and the planner
// charges no update. A stage updating a share of the parameters takes that share of it (the
// update streams through its parameters, gradients and state once).
struct UpdateTimes {
  double sgd = 0, adam = 0, adamw = 0;
  double& of(OptimizerKind kind) {
    return kind == OptimizerKind::Sgd ? sgd : kind == OptimizerKind::Adam ? adam : adamw;
  }
  double of(OptimizerKind kind) const { return const_cast<UpdateTimes*>(this)->of(kind); }
};

struct Profile {
  static constexpr int kSchemaVersion = 2;
  std::string model, preset, device;
  ProfileSource source = ProfileSource::Measured;
  std::string timing;                     // how node times were obtained: "in-step" | "isolated" | "roofline"
  std::string torch_version, created;     // provenance
  Precision precision = Precision::Fp32;  // of the graph profiled: fp32 | bf16
  std::string graph_hash;                 // OpGraph::fingerprint() of the graph profiled ("" in older files)
  std::string notes;  // caveats a reader should know (operators the analytic profile has no formula for)
  int64_t micro_batch_size = 1;
  std::vector<int64_t> profiled_batch_sizes;
  // Worst relative error of the batch-size fits at the profiled sizes: per tensor for bytes,
  // of the whole model's summed forward+backward time for times.
  double fit_max_rel_error = 0;
  std::vector<std::string> blocks;
  std::vector<NodeProfile> nodes;      // execution order; nodes[i].id == i
  std::vector<TensorProfile> tensors;  // tensors[i].id == i
  // Whole-step measurements for cross-checking (0 when not measured).
  int64_t largest_param_bytes = 0;  // the largest single parameter tensor (optimizer temporaries)
  double measured_step_ms = 0;      // forward + backward + optimizer
  double measured_fwd_bwd_ms = 0;   // forward + backward alone
  int64_t measured_peak_bytes = 0;
  // What the device's runtime and libraries keep allocated through the device allocator besides
  // the model (CUDA: cuBLAS / cuBLASLt workspaces, one per thread and stream that runs products),
  // measured before the model exists (memory/runtime_bytes.h); 0 on the CPU and in analytic
  // profiles. Every stage on such a device holds it: the planner adds it to each stage's peak.
  int64_t runtime_bytes = 0;
  // Pinned copies to and from the host, measured where the profile ran (CUDA); swaps cross it.
  // Empty on the CPU and in analytic profiles: the planner then takes --host-bandwidth.
  HostLink host_link;
  // The optimizers' updates: measured where the profile ran (profile/measure_updates.h), from
  // the device's bandwidth in analytic profiles.
  UpdateTimes update_ms;

  int size() const { return static_cast<int>(nodes.size()); }
  // Why this profile cannot stand for a run on `run_device` (c10::Device::str(): "cpu",
  // "cuda:1"), or "": a measured profile's times and workspaces are those of the device type it
  // ran on (any index of it is the same). An analytic profile models a device by its spec and
  // plans ahead for one: taken as given.
  std::string device_mismatch(const std::string& run_device) const;
  // The same profile evaluated at another micro-batch size through the fits.
  Profile at_batch(int64_t batch) const;
};

}  // namespace dawnpiper
