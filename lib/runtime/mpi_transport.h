#pragma once
// MPI point-to-point transport for CPU tensors: stage x is rank x of the communicator. Sends are
// MPI_Isend (non-blocking, as the schedules assume), one per tensor, from the tensor's own
// storage (no packing copy); receives are blocking MPI_Recv straight into freshly allocated
// tensors. The tag encodes the message kind and the micro-batch.
#include <mpi.h>

#include <vector>

#include "runtime/transport.h"

namespace dawnpiper {

class MpiTransport final : public Transport {
 public:
  explicit MpiTransport(MPI_Comm comm);
  ~MpiTransport() override;
  void send(int to_stage, MessageKind kind, int64_t micro_batch, std::vector<at::Tensor> tensors) override;
  std::vector<at::Tensor> recv(int from_stage, MessageKind kind, int64_t micro_batch,
                               const std::vector<const TensorInfo*>& specs) override;
  void flush() override;

 private:
  int tag(MessageKind kind, int64_t micro_batch) const;

  struct Pending {
    MPI_Request request;
    at::Tensor buffer;
  };
  MPI_Comm comm_;
  int tag_ub_ = 32767;
  std::vector<Pending> pending_;  // the latest send's messages
};

}  // namespace dawnpiper
