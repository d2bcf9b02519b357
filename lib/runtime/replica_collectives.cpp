#include "runtime/replica_collectives.h"

#include <algorithm>
#include <climits>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include "runtime/device_placement.h"
#include "runtime/mpi_wait.h"
#include "runtime/nccl_transport.h"
#include "util/error.h"

#ifdef DAWNPIPER_NCCL
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>
#endif

namespace dawnpiper {

ReplicaCollectives::ReplicaCollectives(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_size(comm_, &replicas_);
  MPI_Comm_rank(comm_, &replica_);
}

double ReplicaCollectives::sum(double value) const {
  allreduce_quietly(&value, 1, MPI_DOUBLE, MPI_SUM, comm_);
  return value;
}

namespace {

// A chunk's elements: MPI counts in int, NCCL in size_t; one check for both, so that a bucket
// that one backend cannot move is refused by the other alike.
int message_count(int64_t n) {
  if (n > INT_MAX)
    throw std::runtime_error("a bucket chunk of " + std::to_string(n) + " elements: lower --bucket-size");
  return static_cast<int>(n);
}

int64_t chunk_elements(const at::Tensor& all, int replicas) {
  if (!all.is_contiguous() || all.numel() % replicas != 0)
    throw std::logic_error("a ZeRO collective's buffer: contiguous, a multiple of the replicas");
  return message_count(all.numel() / replicas);
}

class MpiCollective final : public ReplicaCollective {
 public:
  explicit MpiCollective(std::vector<at::Tensor> tensors, size_t messages = 1)
      : tensors_(std::move(tensors)), requests_(messages, MPI_REQUEST_NULL) {}
  ~MpiCollective() override {
    if (any_in_flight(requests_)) keep_until_exit(std::move(tensors_));  // (unfinished: MPI may still write them)
  }
  MPI_Request* request(size_t message = 0) { return &requests_[message]; }
  bool test() override {
    int done = 0;
    MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE);
    return done != 0;
  }
  void wait() override { wait_all_quietly(requests_); }

 private:
  std::vector<at::Tensor> tensors_;
  std::vector<MPI_Request> requests_;
};

// The gathers move elements, never add them: bf16 travels as its 16 bits.
MPI_Datatype mpi_type(at::ScalarType type) {
  if (type == at::kFloat) return MPI_FLOAT;
  if (type == at::kBFloat16) return MPI_UINT16_T;
  throw std::logic_error("ZeRO gathers fp32 or bf16");
}

class MpiCollectives final : public ReplicaCollectives {
 public:
  explicit MpiCollectives(MPI_Comm comm) : ReplicaCollectives(comm) {}
  bool on_device() const override { return false; }
  std::string name() const override { return "mpi"; }
  std::unique_ptr<ReplicaCollective> reduce_scatter(const at::Tensor& send, const at::Tensor& recv) override {
    const int64_t n = chunk_elements(send, replicas_);
    if (recv.numel() != n || !recv.is_contiguous()) throw std::logic_error("reduce_scatter: a chunk's buffer");
    auto c = std::make_unique<MpiCollective>(std::vector<at::Tensor>{send, recv});
    MPI_Ireduce_scatter_block(send.data_ptr<float>(), recv.data_ptr<float>(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                              comm_, c->request());
    return c;
  }
  std::unique_ptr<ReplicaCollective> all_reduce(const at::Tensor& buffer, int64_t chunk_bytes) override {
    const int64_t n = buffer.numel(),
                  chunk = chunk_bytes > 0 ? std::max<int64_t>(1, chunk_bytes / static_cast<int64_t>(sizeof(float)))
                                          : std::max<int64_t>(1, n);
    if (!buffer.is_contiguous() || buffer.scalar_type() != at::kFloat)
      throw std::logic_error("all_reduce: fp32, contiguous");
    auto c =
        std::make_unique<MpiCollective>(std::vector<at::Tensor>{buffer}, static_cast<size_t>((n + chunk - 1) / chunk));
    for (int64_t from = 0, m = 0; from < n; from += chunk, ++m)
      MPI_Iallreduce(MPI_IN_PLACE, buffer.data_ptr<float>() + from, message_count(std::min(chunk, n - from)), MPI_FLOAT,
                     MPI_SUM, comm_, c->request(static_cast<size_t>(m)));
    return c;
  }
  std::unique_ptr<ReplicaCollective> all_gather(const at::Tensor& all) override {
    const int64_t n = chunk_elements(all, replicas_);
    auto c = std::make_unique<MpiCollective>(std::vector<at::Tensor>{all});
    MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all.data_ptr(), static_cast<int>(n), mpi_type(all.scalar_type()),
                   comm_, c->request());
    return c;
  }
};

#ifdef DAWNPIPER_NCCL
void check(ncclResult_t result, const char* what) {
  if (result != ncclSuccess) throw Error(std::string("NCCL ") + what + ": " + ncclGetErrorString(result));
}

class NcclCollective final : public ReplicaCollective {
 public:
  NcclCollective(std::unique_ptr<at::cuda::CUDAEvent> done, c10::Device device)
      : done_(std::move(done)), device_(device) {}
  // Dropped unfinished, the compute stream still waits for it: nothing after it reuses its
  // memory early (the caching allocator holds the tensors for the collectives' stream, too).
  ~NcclCollective() override {
    try {
      wait();
    } catch (...) {
    }
  }
  bool test() override { return done_->query(); }
  void wait() override {
    if (waited_) return;
    done_->block(c10::cuda::getCurrentCUDAStream(device_.index()));
    waited_ = true;
  }

 private:
  std::unique_ptr<at::cuda::CUDAEvent> done_;
  c10::Device device_;
  bool waited_ = false;
};

class NcclCollectives final : public ReplicaCollectives {
 public:
  NcclCollectives(MPI_Comm comm, c10::Device device)
      : ReplicaCollectives(comm),
        device_(device),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index())) {
    ncclUniqueId id;
    if (replica_ == 0) check(ncclGetUniqueId(&id), "unique id");
    broadcast_quietly(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, comm_);
    c10::cuda::CUDAGuard guard(device_);
    check(ncclCommInitRank(&nccl_, replicas_, id, replica_), "communicator init");
  }
  ~NcclCollectives() override {
    try {
      stream_.synchronize();
    } catch (...) {
    }
    ncclCommDestroy(nccl_);
  }
  bool on_device() const override { return true; }
  std::string name() const override { return "nccl"; }
  std::unique_ptr<ReplicaCollective> reduce_scatter(const at::Tensor& send, const at::Tensor& recv) override {
    const int64_t n = chunk_elements(send, replicas_);
    if (recv.numel() != n || !recv.is_contiguous()) throw std::logic_error("reduce_scatter: a chunk's buffer");
    return run({send, recv}, [&](cudaStream_t s) {
      check(ncclReduceScatter(send.data_ptr(), recv.data_ptr(), static_cast<size_t>(n), ncclFloat, ncclSum, nccl_, s),
            "reduce-scatter");
    });
  }
  std::unique_ptr<ReplicaCollective> all_reduce(const at::Tensor& buffer, int64_t) override {
    if (!buffer.is_contiguous() || buffer.scalar_type() != at::kFloat)
      throw std::logic_error("all_reduce: fp32, contiguous");
    return run({buffer}, [&](cudaStream_t s) {
      check(ncclAllReduce(buffer.data_ptr(), buffer.data_ptr(), static_cast<size_t>(buffer.numel()), ncclFloat, ncclSum,
                          nccl_, s),
            "allreduce");
    });
  }
  std::unique_ptr<ReplicaCollective> all_gather(const at::Tensor& all) override {
    const size_t bytes = static_cast<size_t>(chunk_elements(all, replicas_)) * all.element_size();
    char* base = static_cast<char*>(all.data_ptr());
    return run({all}, [&](cudaStream_t s) {  // in place: the send buffer is this replica's chunk of `all`
      check(ncclAllGather(base + replica_ * bytes, base, bytes, ncclInt8, nccl_, s), "all-gather");
    });
  }

 private:
  // After the compute stream's queued work (which wrote the tensors), on the collectives' stream.
  template <class Launch>
  std::unique_ptr<ReplicaCollective> run(const std::vector<at::Tensor>& tensors, Launch launch) {
    c10::cuda::CUDAGuard guard(device_);
    for (const at::Tensor& t : tensors)
      if (!t.is_cuda() || t.device() != device_) throw std::logic_error("an NCCL collective on a tensor off its GPU");
    at::cuda::CUDAEvent ready;
    ready.record(c10::cuda::getCurrentCUDAStream(device_.index()));
    ready.block(stream_);
    launch(stream_.stream());
    for (const at::Tensor& t : tensors) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
    auto done = std::make_unique<at::cuda::CUDAEvent>();
    done->record(stream_);
    return std::make_unique<NcclCollective>(std::move(done), device_);
  }
  c10::Device device_;
  c10::cuda::CUDAStream stream_;
  ncclComm_t nccl_ = nullptr;
};
#endif

}  // namespace

std::unique_ptr<ReplicaCollectives> make_replica_collectives(MPI_Comm replicas, c10::Device device) {
#ifdef DAWNPIPER_NCCL
  if (device.is_cuda() && nccl_available()) {
    // NCCL needs a GPU per replica; decided alike on every rank (the identities are gathered).
    const std::vector<std::string> ids = device_identities(device, replicas);
    if (std::set<std::string>(ids.begin(), ids.end()).size() == ids.size())
      return std::make_unique<NcclCollectives>(replicas, device);
  }
#else
  static_cast<void>(device);
#endif
  return std::make_unique<MpiCollectives>(replicas);
}

}  // namespace dawnpiper
