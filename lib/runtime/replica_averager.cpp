#include "runtime/replica_averager.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "runtime/mpi_transport.h"
#include "runtime/replica_collectives.h"
#include "runtime/zero_shard.h"

namespace dawnpiper {

namespace {

class BucketAverager;

// Tells the averager that autograd accumulated parameter `param`'s gradient.
class AccumulatedHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  AccumulatedHook(BucketAverager* averager, size_t param) : averager_(averager), param_(param) {}
  void operator()(const torch::autograd::Variable&) override;

 private:
  BucketAverager* averager_;
  size_t param_;
};

// fp32 buffers reduced by non-blocking allreduces, in the same order on every replica (MPI and
// NCCL match collectives by order): in host memory over MPI, on the device over NCCL.
class BucketAverager final : public ReplicaAverager {
 public:
  BucketAverager(std::unique_ptr<ReplicaCollectives> collectives, const std::vector<StageParameter>& params,
                 int64_t bucket_bytes, const std::vector<bool>& deferred, bool split_backward)
      : collectives_(std::move(collectives)), split_(split_backward), per_tensor_(bucket_bytes <= 0) {
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
      buckets_.push_back(std::move(bucket));
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
  ~BucketAverager() override {
    // (An error unwinds the stage: the allreduces under way keep their buffers.)
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
    // In the order they started (MPI's waits sleep between tests, runtime/mpi_wait.h), each
    // seen complete by the tests before its wait or where its wait returns.
    int64_t bytes = 0;
    for (size_t k : order_) {
      poll(Clock::now());
      Bucket& b = buckets_[k];
      b.collective->wait();
      if (!b.done) b.done = true, b.end_time = Clock::now();
      b.collective.reset();
      b.buffer.div_(static_cast<double>(collectives_->replicas()));
      for (size_t p = b.first; p < b.end; ++p) {
        if (bucket_of_[p] < 0) continue;
        at::Tensor& grad = tensors_[p].mutable_grad();
        if (per_tensor_) {
          if (!b.buffer.is_same(grad)) grad = b.buffer.to(tensors_[p].device(), tensors_[p].scalar_type());
          continue;
        }
        const at::Tensor view =
            b.buffer.narrow(0, param_offset_[p] - b.begin, tensors_[p].numel()).view(tensors_[p].sizes());
        grad = view.device() == tensors_[p].device() && tensors_[p].scalar_type() == at::kFloat
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
    return collectives_->name() +
           (per_tensor_ ? ", parameter by parameter"
                        : " in " + std::to_string(buckets_.size()) + " bucket" + (buckets_.size() == 1 ? "" : "s"));
  }

 private:
  struct Bucket {
    size_t first = 0, end = 0;  // its parameters, [first, end)
    int64_t begin = 0, numel = 0;
    bool deferred = false;                          // holds a weight tied across stages: starts at the pass's end
    at::Tensor buffer;                              // from its start until average()
    std::unique_ptr<ReplicaCollective> collective;  // its allreduce, until average()
    bool started = false, done = false;
    Clock::time_point start_time, end_time;
  };
  // Packs the bucket's gradients (zeros where undefined; released: the buffer holds them) and
  // starts its allreduce; per parameter, in place where the gradient is fp32 where the
  // collectives run already.
  void start_bucket(size_t k) {
    at::NoGradGuard no_grad;
    Bucket& b = buckets_[k];
    const at::TensorOptions where =
        at::TensorOptions(at::kFloat)
            .device(collectives_->on_device() && !tensors_.empty() ? tensors_.front().device() : c10::Device(at::kCPU));
    if (per_tensor_) {
      at::Tensor& grad = tensors_[b.first].mutable_grad();
      if (!grad.defined()) grad = at::zeros_like(tensors_[b.first]);
      b.buffer = grad.to(where).contiguous();
    } else {
      b.buffer = at::empty({b.numel}, where);
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
    // Over MPI in messages of kMessageChunkBytes (ReplicaCollectives::all_reduce); parameter by
    // parameter, one each (the averaging before buckets).
    b.collective = collectives_->all_reduce(b.buffer, per_tensor_ ? 0 : kMessageChunkBytes);
  }
  // Tests the started buckets' reductions (Open MPI advances non-blocking collectives inside MPI
  // calls), each seen complete at `now`.
  void poll(Clock::time_point now) {
    for (Bucket& b : buckets_)
      if (b.started && !b.done && b.collective->test()) b.done = true, b.end_time = now;
  }

  std::unique_ptr<ReplicaCollectives> collectives_;
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
};

void AccumulatedHook::operator()(const torch::autograd::Variable&) { averager_->accumulated(param_); }

}  // namespace

std::unique_ptr<ReplicaAverager> make_replica_averager(MPI_Comm replicas, c10::Device device,
                                                       const std::vector<StageParameter>& parameters,
                                                       int64_t bucket_bytes, std::vector<bool> deferred,
                                                       bool split_backward) {
  return std::make_unique<BucketAverager>(make_replica_collectives(replicas, device), parameters, bucket_bytes,
                                          deferred, split_backward);
}

}  // namespace dawnpiper
