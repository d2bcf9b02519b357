#pragma once
// The transport a pipeline rank uses, chosen per link to each neighbouring stage:
//   mpi     CPU tensors over MPI point-to-point (MpiTransport);
//   nccl    CUDA tensors over NCCL, for neighbours on different GPUs (nccl_transport.h);
//   host    CUDA tensors staged through host memory and sent over MPI: what works when two
//           ranks share one GPU (NCCL refuses them one communicator) or NCCL is missing.
// `auto` takes mpi on the CPU, and on CUDA nccl between different GPUs, host between ranks
// on the same one.
#include <mpi.h>

#include <memory>
#include <string>

#include <c10/core/Device.h>

#include "runtime/mpi_transport.h"
#include "runtime/transport.h"
#include "util/enum_names.h"

namespace dawnpiper {

enum class TransportKind { Auto, Mpi, Nccl, Host };
template <>
struct EnumNames<TransportKind> {
  static constexpr const char* what = "transport";
  static constexpr std::array<std::pair<TransportKind, const char*>, 4> table{{{TransportKind::Auto, "auto"},
                                                                               {TransportKind::Mpi, "mpi"},
                                                                               {TransportKind::Nccl, "nccl"},
                                                                               {TransportKind::Host, "host"}}};
  static constexpr std::array<const char*, 4> meaning{
      "", "CPU tensors", "CUDA, ranks on different GPUs",
      "CUDA through host memory over MPI; what auto takes between ranks sharing a GPU"};
};

// CUDA tensors through host memory: a device-to-host copy, MPI, a host-to-device copy at the
// receiver. On the CPU the copies are no-ops (it is MpiTransport).
class HostStagedTransport final : public Transport {
 public:
  HostStagedTransport(MPI_Comm comm, c10::Device device, int sends_in_flight = 1)
      : mpi_(comm, sends_in_flight), device_(device) {}
  void send(int to_stage, MessageKind kind, int64_t micro_batch, std::vector<at::Tensor> tensors) override;
  std::vector<at::Tensor> recv(int from_stage, MessageKind kind, int64_t micro_batch,
                               const std::vector<const TensorInfo*>& specs) override;
  void flush() override { mpi_.flush(); }

 private:
  MpiTransport mpi_;
  c10::Device device_;
};

// One transport per neighbouring stage; sends and receives go to the link of their peer.
// A send first completes the other link's pending sends, so a stage has one send in flight.
class RoutedTransport final : public Transport {
 public:
  RoutedTransport(int stage, std::unique_ptr<Transport> to_previous, std::unique_ptr<Transport> to_next);
  void send(int to_stage, MessageKind kind, int64_t micro_batch, std::vector<at::Tensor> tensors) override;
  std::vector<at::Tensor> recv(int from_stage, MessageKind kind, int64_t micro_batch,
                               const std::vector<const TensorInfo*>& specs) override;
  void flush() override;

 private:
  Transport& link(int stage);
  void count();
  int stage_;
  std::unique_ptr<Transport> previous_, next_;
};

struct PipelineTransport {
  std::unique_ptr<Transport> transport;
  std::string description;  // e.g. "nccl" or "0-1 nccl, 1-2 host"
};

// ConfigError for a choice that cannot work on `device` (nccl on the CPU or without NCCL, mpi
// with CUDA); sharing a GPU is found only by make_pipeline_transport.
void check_transport(TransportKind choice, c10::Device device);

// What the schedule asks of the links: whether a rank sends to any other (interleaved: the last
// rank to the first, both ways on every link), and how many sends go on at once.
struct LinkNeeds {
  bool any_peer = false;
  int sends_in_flight = 1;
};

// This rank's transport (rank == stage in `comm`, or a rank of several stages where any_peer):
// on CUDA, host-staged MPI where the schedule needs any peer or several sends going. Collective
// over `comm`. ConfigError for a choice that cannot work (nccl on the CPU, between ranks sharing a
// GPU, or for those needs: NCCL would match two directions' messages by order alone, and its
// links complete each send before the next; mpi with CUDA).
PipelineTransport make_pipeline_transport(MPI_Comm comm, c10::Device device, TransportKind choice,
                                          LinkNeeds needs = {});

}  // namespace dawnpiper
