#include "runtime/nccl_transport.h"

#include "data/scalar_type.h"
#include "util/error.h"

#ifdef DAWNPIPER_NCCL
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

#include <vector>
#endif

namespace dawnpiper {

#ifdef DAWNPIPER_NCCL

namespace {

void check(ncclResult_t result, const char* what) {
  if (result != ncclSuccess) throw Error(std::string("NCCL ") + what + ": " + ncclGetErrorString(result));
}

class NcclLink final : public Transport {
 public:
  NcclLink(MPI_Comm comm, int peer, c10::Device device) : peer_(peer), device_(device) {
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    lower_ = rank < peer;
    ncclUniqueId ids[2];
    if (lower_) {
      check(ncclGetUniqueId(&ids[0]), "unique id");
      check(ncclGetUniqueId(&ids[1]), "unique id");
      MPI_Send(ids, sizeof ids, MPI_BYTE, peer, 0, comm);
    } else {
      MPI_Recv(ids, sizeof ids, MPI_BYTE, peer, 0, comm, MPI_STATUS_IGNORE);
    }
    const int me = lower_ ? 0 : 1;
    // Both sides create the activation communicator first.
    for (int i = 0; i < 2; ++i) {
      Channel& c = i == 0 ? up_ : down_;
      check(ncclCommInitRank(&c.comm, 2, ids[i], me), "communicator init");
      c.stream = std::make_unique<c10::cuda::CUDAStream>(c10::cuda::getStreamFromPool(true, device.index()));
    }
  }

  ~NcclLink() override {
    try {
      flush();
    } catch (...) {
    }
    for (Channel* c : {&up_, &down_})
      if (c->comm) ncclCommDestroy(c->comm);
  }

  void send(int to_stage, MessageKind kind, int64_t, std::vector<at::Tensor> tensors) override {
    Channel& c = channel(to_stage, kind);
    // The previous send's buffers go now, as the planner's memory replay assumes; the caching
    // allocator reuses them only after the send stream is done with them (recordStream).
    pending_.clear();
    dense_once_per_view(tensors, [](const at::Tensor& t) { return t.contiguous(); });
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
    at::cuda::CUDAEvent ready;
    ready.record(compute);
    ready.block(*c.stream);
    check(ncclGroupStart(), "group start");
    for (const at::Tensor& t : tensors)
      check(ncclSend(t.data_ptr(), static_cast<size_t>(t.nbytes()), ncclInt8, peer_rank(), c.comm, c.stream->stream()),
            "send");
    check(ncclGroupEnd(), "group end");
    for (at::Tensor& t : tensors) {
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), *c.stream);
      bytes_sent_ += static_cast<int64_t>(t.nbytes());
      pending_.push_back(std::move(t));
    }
  }

  std::vector<at::Tensor> recv(int from_stage, MessageKind kind, int64_t,
                               const std::vector<const TensorInfo*>& specs) override {
    Channel& c = channel(from_stage, kind);
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
    std::vector<at::Tensor> out;
    for (const TensorInfo* s : specs)
      out.push_back(at::empty(s->shape, at::TensorOptions(scalar_type(s->dtype)).device(device_)));
    // The buffers come from the compute stream's pool: the receive waits for its queued work.
    at::cuda::CUDAEvent allocated;
    allocated.record(compute);
    allocated.block(*c.stream);
    check(ncclGroupStart(), "group start");
    for (at::Tensor& t : out)
      check(ncclRecv(t.data_ptr(), static_cast<size_t>(t.nbytes()), ncclInt8, peer_rank(), c.comm, c.stream->stream()),
            "receive");
    check(ncclGroupEnd(), "group end");
    at::cuda::CUDAEvent arrived;
    arrived.record(*c.stream);
    arrived.block(compute);
    for (const at::Tensor& t : out) bytes_received_ += static_cast<int64_t>(t.nbytes());
    return out;
  }

  void flush() override {
    for (Channel* c : {&up_, &down_})
      if (c->stream) c->stream->synchronize();
    pending_.clear();
  }

 private:
  struct Channel {
    ncclComm_t comm = nullptr;
    std::unique_ptr<c10::cuda::CUDAStream> stream;
  };
  int peer_rank() const { return lower_ ? 1 : 0; }
  // Activations travel from the lower rank to the upper, gradients back.
  Channel& channel(int stage, MessageKind kind) {
    if (stage != peer_)
      throw std::logic_error("NCCL link to rank " + std::to_string(peer_) + " used for rank " + std::to_string(stage));
    return kind == MessageKind::Activation ? up_ : down_;
  }

  int peer_;
  c10::Device device_;
  bool lower_ = false;
  Channel up_, down_;
  std::vector<at::Tensor> pending_;
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<Transport> make_nccl_link(MPI_Comm comm, int peer, c10::Device device) {
  if (!device.is_cuda()) throw ConfigError("--transport nccl moves CUDA tensors: use it with --device cuda");
  return std::make_unique<NcclLink>(comm, peer, device);
}

#else

bool nccl_available() { return false; }

std::unique_ptr<Transport> make_nccl_link(MPI_Comm, int, c10::Device) {
  throw ConfigError("--transport nccl: this build has no NCCL (see CMakeLists.txt); use --transport host");
}

#endif

}  // namespace dawnpiper
