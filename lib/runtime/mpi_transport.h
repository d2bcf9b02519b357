#pragma once
// MPI point-to-point transport for CPU tensors: stage x is rank x of the communicator. Sends are
// MPI_Isend (non-blocking, as the schedules assume) from each tensor's own storage (no packing
// copy); receives go straight into freshly allocated tensors. Each tensor travels as chunks of
// kMessageChunkBytes, one message each (MPI keeps messages of one source, tag and communicator in
// order), so that a wait sees a large transfer progress and keeps testing while it does
// (wait_all_quietly). The tag encodes the message kind and the micro-batch.
#include <mpi.h>

#include <deque>
#include <vector>

#include "runtime/transport.h"

namespace dawnpiper {

// 1 MiB: a 24 MiB message between two ranks on this machine took 3.5 ms in 1 MiB chunks, 4.2 ms in
// 256 KiB, 10.3 ms in 4 MiB, 41 ms whole, without Open MPI's shared-memory single copy
// (docs/gpu.md).
inline constexpr int64_t kMessageChunkBytes = int64_t{1} << 20;

class MpiTransport final : public Transport {
 public:
  // `sends_in_flight`: how many sends go on at once; a send first completes the oldest beyond
  // that (ScheduleTraits::sends_in_flight).
  explicit MpiTransport(MPI_Comm comm, int sends_in_flight = 1);
  ~MpiTransport() override;
  void send(int to_stage, MessageKind kind, int64_t micro_batch, std::vector<at::Tensor> tensors) override;
  std::vector<at::Tensor> recv(int from_stage, MessageKind kind, int64_t micro_batch,
                               const std::vector<const TensorInfo*>& specs) override;
  void flush() override;

 private:
  int tag(MessageKind kind, int64_t micro_batch) const;

  struct Pending {
    std::vector<MPI_Request> requests;  // one per chunk
    std::vector<at::Tensor> buffers;    // what they are sent from (referenced until done)
  };
  void complete_oldest();

  MPI_Comm comm_;
  int sends_in_flight_;
  int tag_ub_ = 32767;
  std::deque<Pending> pending_;  // the latest sends, oldest first
};

}  // namespace dawnpiper
