#include "runtime/replica_averager.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <set>

#include "runtime/device_placement.h"
#include "runtime/mpi_wait.h"
#include "runtime/nccl_transport.h"
#include "util/error.h"

#ifdef DAWNPIPER_NCCL
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>
#endif

namespace dawnpiper {

namespace {

class MpiAverager final : public ReplicaAverager {
 public:
  explicit MpiAverager(MPI_Comm comm) : comm_(comm) { MPI_Comm_size(comm, &size_); }
  // Host fp32 gradients are reduced in place by non-blocking allreduces, one per parameter, in
  // the parameters' order on every replica (MPI matches collectives by order).
  void start(std::vector<StageParameter>& params) override {
    at::NoGradGuard no_grad;
    for (StageParameter& p : params) {
      at::Tensor& grad = p.tensor.mutable_grad();
      if (!grad.defined()) grad = at::zeros_like(p.tensor);
      if (!grad.device().is_cpu() || grad.scalar_type() != at::kFloat || !grad.is_contiguous()) continue;
      started_.push_back(grad);
      requests_.push_back(MPI_REQUEST_NULL);
      MPI_Iallreduce(MPI_IN_PLACE, grad.data_ptr(), static_cast<int>(grad.numel()), MPI_FLOAT, MPI_SUM, comm_,
                     &requests_.back());
    }
  }
  int64_t average(std::vector<StageParameter>& params) override {
    at::NoGradGuard no_grad;
    int64_t bytes = 0;
    if (!started_.empty()) {
      wait_all_quietly(requests_);
      for (at::Tensor& grad : started_) grad.div_(static_cast<double>(size_));
      for (const at::Tensor& grad : started_) bytes += grad.numel() * grad.element_size();
    }
    for (StageParameter& p : params) {
      if (std::any_of(started_.begin(), started_.end(),
                      [&](const at::Tensor& g) { return g.is_same(p.tensor.grad()); }))
        continue;
      if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
      // In host memory (MPI is not assumed CUDA-aware); a no-op copy on the CPU.
      at::Tensor grad = p.tensor.mutable_grad().to(at::kCPU, at::kFloat).contiguous();
      allreduce_quietly(grad.data_ptr(), static_cast<int>(grad.numel()), MPI_FLOAT, MPI_SUM, comm_);
      grad.div_(static_cast<double>(size_));
      p.tensor.mutable_grad() = grad.to(p.tensor.device(), p.tensor.scalar_type());
      bytes += grad.numel() * grad.element_size();
    }
    started_.clear();
    requests_.clear();
    return bytes;
  }
  std::string description() const override { return "mpi"; }

 private:
  MPI_Comm comm_;
  int size_ = 1;
  std::vector<at::Tensor> started_;  // the gradients being reduced since start()
  std::vector<MPI_Request> requests_;
};

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

std::unique_ptr<ReplicaAverager> make_replica_averager(MPI_Comm replicas, c10::Device device) {
#ifdef DAWNPIPER_NCCL
  if (device.is_cuda() && nccl_available()) {
    // NCCL needs a GPU per replica; decided alike on every rank (the identities are gathered).
    const std::vector<std::string> ids = device_identities(device, replicas);
    if (std::set<std::string>(ids.begin(), ids.end()).size() == ids.size())
      return std::make_unique<NcclAverager>(replicas, device);
  }
#endif
  return std::make_unique<MpiAverager>(replicas);
}

}  // namespace dawnpiper
