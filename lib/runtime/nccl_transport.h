#pragma once
// NCCL point-to-point between two adjacent stages on different GPUs. Two communicators per
// pair, one per direction (activations go up, gradients come down), each driven by its own
// CUDA stream on each side: a send or receive waits for the compute stream's queued work,
// runs beside the compute that follows, and the compute stream waits for a receive only where
// it reads the tensors. One stream per direction keeps every communicator's operations in the
// same order on both sides (micro-batches in order), which NCCL's blocking kernels need.
#include <mpi.h>

#include <memory>

#include <c10/core/Device.h>

#include "runtime/transport.h"

namespace dawnpiper {

// True when this build has NCCL (a CUDA LibTorch and NCCL found at configure time).
bool nccl_available();

// The link from this rank to `peer` (rank ± 1 in `comm`). Collective between the two: the lower
// rank creates the NCCL ids and sends them over `comm`. Throws Error without NCCL.
std::unique_ptr<Transport> make_nccl_link(MPI_Comm comm, int peer, c10::Device device);

}  // namespace dawnpiper
