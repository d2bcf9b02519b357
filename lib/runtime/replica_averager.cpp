#include "runtime/replica_averager.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <climits>
#include <set>
#include <stdexcept>
#include <thread>

#include "runtime/device_placement.h"
#include "runtime/mpi_transport.h"
#include "runtime/mpi_wait.h"
#include "runtime/nccl_transport.h"
#include "runtime/zero_shard.h"
#include "util/error.h"

#ifdef DAWNPIPER_NCCL
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>
#endif

namespace dawnpiper {

namespace {

class MpiAverager;

// Tells the averager that autograd accumulated parameter `param`'s gradient.
class AccumulatedHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  AccumulatedHook(MpiAverager* averager, size_t param) : averager_(averager), param_(param) {}
  void operator()(const torch::autograd::Variable&) override;

 private:
  MpiAverager* averager_;
  size_t param_;
};

int mpi_count(int64_t n) {
  if (n > INT_MAX)
    throw std::runtime_error("a gradient bucket of " + std::to_string(n) + " elements: lower --bucket-size");
  return static_cast<int>(n);
}

// Host fp32 buffers reduced by non-blocking allreduces, in the same order on every replica
// (MPI matches collectives by order).
class MpiAverager final : public ReplicaAverager {
 public:
  MpiAverager(MPI_Comm comm, const std::vector<StageParameter>& params, int64_t bucket_bytes,
              const std::vector<bool>& deferred, bool split_backward)
      : comm_(comm), split_(split_backward), per_tensor_(bucket_bytes <= 0) {
    MPI_Comm_size(comm, &size_);
    std::vector<int64_t> numels;
    std::vector<int> nodes;
    for (const StageParameter& p : params) {
      tensors_.push_back(p.tensor);
      numels.push_back(p.tensor.numel());
      nodes.push_back(p.node);
    }
    bucket_of_.assign(params.size(), -1);
    if (per_tensor_) {  // one per parameter, in their order, in place
      for (size_t p = 0; p < params.size(); ++p)
        if (numels[p] > 0) {
          bucket_of_[p] = static_cast<int>(buckets_.size());
          order_.push_back(buckets_.size());
          buckets_.push_back(Bucket{p, p + 1, 0, numels[p], false});
        }
      return;
    }
    const ShardLayout layout =
        shard_layout(numels, std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(sizeof(float))), 1, 0, nodes);
    param_offset_ = layout.param_offset;
    for (const ShardLayout::Bucket& b : layout.buckets) {
      Bucket bucket{b.first_param, b.end_param, b.begin, b.numel, false};
      for (size_t p = b.first_param; p < b.end_param; ++p) {
        if (numels[p] > 0) bucket_of_[p] = static_cast<int>(buckets_.size());
        if (!deferred.empty() && deferred[p]) bucket.deferred = true;
      }
      buckets_.push_back(bucket);
    }
    // The hooks' buckets, the last first; then those waiting for the pass's end.
    for (size_t k = buckets_.size(); k-- > 0;)
      if (!buckets_[k].deferred) order_.push_back(k);
    for (size_t k = 0; k < buckets_.size(); ++k)
      if (buckets_[k].deferred) order_.push_back(k);
    for (size_t p = 0; p < params.size(); ++p)
      if (bucket_of_[p] >= 0 && !buckets_[static_cast<size_t>(bucket_of_[p])].deferred)
        torch::autograd::impl::set_post_acc_grad_hooks(tensors_[p], std::make_unique<AccumulatedHook>(this, p));
    count_.assign(params.size(), 0);
  }
  ~MpiAverager() override {
    for (Bucket& b : buckets_)
      if (b.started && !b.done && any_in_flight(b.requests)) keep_until_exit(std::move(b.buffer));  // (an error)
    if (per_tensor_) return;
    for (size_t p = 0; p < tensors_.size(); ++p)
      if (bucket_of_[p] >= 0 && !buckets_[static_cast<size_t>(bucket_of_[p])].deferred)
        torch::autograd::impl::set_post_acc_grad_hooks(tensors_[p], nullptr);
  }

  void begin_pass(bool last) override {
    if (per_tensor_) return;
    if (passes_++ > 0) learned_ = count_;  // the pass before: how often each parameter accumulated
    std::fill(count_.begin(), count_.end(), 0);
    // A split backward's W accumulates a parameter once per node reading it: known from a W
    // before (without one, the step's first, its buckets start at its end); B, once.
    armed_ = last && (!split_ || !learned_.empty());
    if (!armed_) return;
    expected_ = split_ ? learned_ : std::vector<int>(tensors_.size(), 1);
    waiting_.assign(buckets_.size(), 0);
    for (size_t k = 0; k < buckets_.size(); ++k) {
      if (buckets_[k].deferred) waiting_[k] = 1;  // (never 0: they start at the pass's end)
      for (size_t p = buckets_[k].first; p < buckets_[k].end && !buckets_[k].deferred; ++p)
        if (bucket_of_[p] >= 0 && expected_[p] > 0) ++waiting_[k];
    }
  }
  void accumulated(size_t param) {
    ++count_[param];
    if (!armed_) return;
    const size_t k = static_cast<size_t>(bucket_of_[param]);
    if (buckets_[k].started)
      throw std::logic_error("parameter " + std::to_string(param) + " accumulated a gradient after its bucket started");
    if (count_[param] == expected_[param]) --waiting_[k];
    while (next_ < order_.size() && waiting_[order_[next_]] == 0) start_bucket(order_[next_++]);
    poll(Clock::now());
  }
  void start(std::vector<StageParameter>&) override {
    for (; next_ < order_.size(); ++next_) start_bucket(order_[next_]);
    armed_ = false;
  }
  int64_t average(std::vector<StageParameter>& params) override {
    at::NoGradGuard no_grad;
    for (size_t p = 0; p < params.size() && p < tensors_.size(); ++p)
      if (!params[p].tensor.is_same(tensors_[p])) tensors_[p] = params[p].tensor;  // (async's stashing)
    for (; next_ < order_.size(); ++next_) start_bucket(order_[next_]);
    armed_ = false;
    // Tested together, sleeping between tests (runtime/mpi_wait.h), the pause starting again
    // from its shortest whenever a part completed.
    std::chrono::microseconds pause{2};
    for (int idle = 0; poll(Clock::now());) {
      if (progress_) {
        pause = std::chrono::microseconds{2}, idle = 0;
      } else if (++idle >= 16) {
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, kMaxPause);
      }
    }
    int64_t bytes = 0;
    for (size_t k : order_) {
      Bucket& b = buckets_[k];
      b.buffer.div_(static_cast<double>(size_));
      for (size_t p = b.first; p < b.end; ++p) {
        if (bucket_of_[p] < 0) continue;
        at::Tensor& grad = tensors_[p].mutable_grad();
        if (per_tensor_) {
          if (!b.buffer.is_same(grad)) grad = b.buffer.to(tensors_[p].device(), tensors_[p].scalar_type());
          continue;
        }
        const at::Tensor view =
            b.buffer.narrow(0, param_offset_[p] - b.begin, tensors_[p].numel()).view(tensors_[p].sizes());
        grad = tensors_[p].device().is_cpu() && tensors_[p].scalar_type() == at::kFloat
                   ? view
                   : view.to(tensors_[p].device(), tensors_[p].scalar_type());
      }
      bytes += b.numel * static_cast<int64_t>(sizeof(float));
      if (listener_)
        listener_(static_cast<int>(k), b.numel * static_cast<int64_t>(sizeof(float)), b.start_time, b.end_time);
      b.buffer = at::Tensor();  // the gradients hold it now
      b.started = b.done = false;
    }
    next_ = 0;
    return bytes;
  }
  void set_listener(Listener listener) override { listener_ = std::move(listener); }
  std::string description() const override {
    return per_tensor_ ? "mpi, parameter by parameter"
                       : "mpi in " + std::to_string(buckets_.size()) + " bucket" + (buckets_.size() == 1 ? "" : "s");
  }

 private:
  struct Bucket {
    size_t first = 0, end = 0;  // its parameters, [first, end)
    int64_t begin = 0, numel = 0;
    bool deferred = false;              // holds a weight tied across stages: starts at the pass's end
    at::Tensor buffer;                  // from its start until average()
    std::vector<MPI_Request> requests;  // one per chunk of at most kMessageChunkBytes
    bool started = false, done = false;
    Clock::time_point start_time, end_time;
  };
  // Packs the bucket's gradients (zeros where undefined; released: the buffer holds them) and
  // starts its allreduce; per parameter, in place where the gradient is host fp32 already.
  void start_bucket(size_t k) {
    at::NoGradGuard no_grad;
    Bucket& b = buckets_[k];
    if (per_tensor_) {
      at::Tensor& grad = tensors_[b.first].mutable_grad();
      if (!grad.defined()) grad = at::zeros_like(tensors_[b.first]);
      b.buffer = grad.to(at::kCPU, at::kFloat).contiguous();
    } else {
      b.buffer = at::empty({b.numel}, at::kFloat);
      for (size_t p = b.first; p < b.end; ++p) {
        if (bucket_of_[p] < 0) continue;
        at::Tensor part = b.buffer.narrow(0, param_offset_[p] - b.begin, tensors_[p].numel());
        const at::Tensor& g = tensors_[p].grad();
        if (g.defined())
          part.copy_(g.reshape({-1}));
        else
          part.zero_();
        tensors_[p].mutable_grad() = at::Tensor();
      }
    }
    b.started = true;
    b.start_time = Clock::now();
    // In chunks, as allreduce_chunked_quietly: a large message advances in fragments that need
    // both ranks inside MPI, and each chunk done restarts the waiting's pause. Parameter by
    // parameter, one each (the averaging before buckets).
    const int64_t chunk = per_tensor_ ? b.numel : kMessageChunkBytes / static_cast<int64_t>(sizeof(float));
    b.requests.assign(static_cast<size_t>((b.numel + chunk - 1) / chunk), MPI_REQUEST_NULL);
    for (size_t c = 0; c < b.requests.size(); ++c) {
      const int64_t from = static_cast<int64_t>(c) * chunk;
      MPI_Iallreduce(MPI_IN_PLACE, b.buffer.data_ptr<float>() + from, mpi_count(std::min(chunk, b.numel - from)),
                     MPI_FLOAT, MPI_SUM, comm_, &b.requests[c]);
    }
  }
  // Tests the started buckets' reductions (Open MPI advances non-blocking collectives inside MPI
  // calls), each seen complete at `now`; whether any is left. progress_: a part completed.
  bool poll(Clock::time_point now) {
    bool left = false;
    progress_ = false;
    for (Bucket& b : buckets_) {
      if (!b.started || b.done) continue;
      int count = 0;
      indices_.resize(b.requests.size());
      MPI_Testsome(static_cast<int>(b.requests.size()), b.requests.data(), &count, indices_.data(),
                   MPI_STATUSES_IGNORE);
      progress_ = progress_ || count > 0;
      if (count == MPI_UNDEFINED || !any_in_flight(b.requests))
        b.done = true, b.end_time = now;
      else
        left = true;
    }
    return left;
  }

  MPI_Comm comm_;
  int size_ = 1;
  bool split_ = false, per_tensor_ = false;
  std::vector<at::Tensor> tensors_;    // the stage's parameters
  std::vector<int64_t> param_offset_;  // per parameter, in the flat space
  std::vector<int> bucket_of_;         // per parameter: its bucket, -1: none (no elements)
  std::vector<Bucket> buckets_;
  std::vector<size_t> order_;  // the buckets, in the order they start
  size_t next_ = 0;            // into order_: the next to start
  // The step's last weight pass: per parameter, its accumulations so far in the pass, those of
  // the pass before, those awaited; per bucket, its parameters still awaited.
  std::vector<int> count_, learned_, expected_, waiting_;
  int64_t passes_ = 0;
  bool armed_ = false;
  Listener listener_;
  bool progress_ = false;
  std::vector<int> indices_;
};

void AccumulatedHook::operator()(const torch::autograd::Variable&) { averager_->accumulated(param_); }

#ifdef DAWNPIPER_NCCL
void check(ncclResult_t result, const char* what) {
  if (result != ncclSuccess) throw Error(std::string("NCCL ") + what + ": " + ncclGetErrorString(result));
}

// On the compute stream, in place: the optimizer step that follows reads the averages there.
class NcclAverager final : public ReplicaAverager {
 public:
  NcclAverager(MPI_Comm comm, c10::Device device) : device_(device) {
    int rank = 0, size = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    ncclUniqueId id;
    if (rank == 0) check(ncclGetUniqueId(&id), "unique id");
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm);
    c10::cuda::CUDAGuard guard(device);
    check(ncclCommInitRank(&comm_, size, id, rank), "communicator init");
  }
  ~NcclAverager() override { ncclCommDestroy(comm_); }
  int64_t average(std::vector<StageParameter>& params) override {
    at::NoGradGuard no_grad;
    c10::cuda::CUDAGuard guard(device_);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
    int64_t bytes = 0;
    check(ncclGroupStart(), "group start");
    for (StageParameter& p : params) {
      if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
      at::Tensor& grad = p.tensor.mutable_grad();
      if (!grad.is_contiguous() || grad.scalar_type() != at::kFloat) grad = grad.to(at::kFloat).contiguous();
      check(ncclAllReduce(grad.data_ptr(), grad.data_ptr(), static_cast<size_t>(grad.numel()), ncclFloat, ncclAvg,
                          comm_, stream),
            "allreduce");
      bytes += grad.numel() * grad.element_size();
    }
    check(ncclGroupEnd(), "group end");
    for (StageParameter& p : params)
      if (p.tensor.mutable_grad().scalar_type() != p.tensor.scalar_type())
        p.tensor.mutable_grad() = p.tensor.mutable_grad().to(p.tensor.scalar_type());
    return bytes;
  }
  std::string description() const override { return "nccl"; }

 private:
  c10::Device device_;
  ncclComm_t comm_ = nullptr;
};
#endif

}  // namespace

std::unique_ptr<ReplicaAverager> make_replica_averager(MPI_Comm replicas, c10::Device device,
                                                       const std::vector<StageParameter>& parameters,
                                                       int64_t bucket_bytes, std::vector<bool> deferred,
                                                       bool split_backward) {
#ifdef DAWNPIPER_NCCL
  if (device.is_cuda() && nccl_available()) {
    // NCCL needs a GPU per replica; decided alike on every rank (the identities are gathered).
    const std::vector<std::string> ids = device_identities(device, replicas);
    if (std::set<std::string>(ids.begin(), ids.end()).size() == ids.size())
      return std::make_unique<NcclAverager>(replicas, device);
  }
#endif
  return std::make_unique<MpiAverager>(replicas, parameters, bucket_bytes, deferred, split_backward);
}

}  // namespace dawnpiper
