#include "runtime/pipeline_transport.h"

#include <stdexcept>

#include "runtime/device_placement.h"
#include "runtime/nccl_transport.h"
#include "util/error.h"

namespace dawnpiper {

void HostStagedTransport::send(int to_stage, MessageKind kind, int64_t micro_batch, std::vector<at::Tensor> tensors) {
  dense_once_per_view(tensors, [](const at::Tensor& t) { return t.to(at::kCPU).contiguous(); });
  mpi_.send(to_stage, kind, micro_batch, std::move(tensors));
  bytes_sent_ = mpi_.bytes_sent();
}

std::vector<at::Tensor> HostStagedTransport::recv(int from_stage, MessageKind kind, int64_t micro_batch,
                                                  const std::vector<const TensorInfo*>& specs) {
  std::vector<at::Tensor> out = mpi_.recv(from_stage, kind, micro_batch, specs);
  for (at::Tensor& t : out) t = t.to(device_);
  bytes_received_ = mpi_.bytes_received();
  return out;
}

RoutedTransport::RoutedTransport(int stage, std::unique_ptr<Transport> to_previous, std::unique_ptr<Transport> to_next)
    : stage_(stage), previous_(std::move(to_previous)), next_(std::move(to_next)) {}

Transport& RoutedTransport::link(int stage) {
  std::unique_ptr<Transport>& l = stage == stage_ - 1 ? previous_ : next_;
  if ((stage != stage_ - 1 && stage != stage_ + 1) || !l)
    throw std::logic_error("stage " + std::to_string(stage_) + " has no link to stage " + std::to_string(stage));
  return *l;
}

void RoutedTransport::count() {
  bytes_sent_ = bytes_received_ = 0;
  for (const auto* l : {&previous_, &next_})
    if (*l) bytes_sent_ += (*l)->bytes_sent(), bytes_received_ += (*l)->bytes_received();
}

void RoutedTransport::send(int to_stage, MessageKind kind, int64_t micro_batch, std::vector<at::Tensor> tensors) {
  // A send completes the stage's previous one, whichever link it took (as MpiTransport does,
  // and as the planner's memory replay assumes).
  Transport& target = link(to_stage);
  if (std::unique_ptr<Transport>& other = to_stage == stage_ - 1 ? next_ : previous_) other->flush();
  target.send(to_stage, kind, micro_batch, std::move(tensors));
  count();
}

std::vector<at::Tensor> RoutedTransport::recv(int from_stage, MessageKind kind, int64_t micro_batch,
                                              const std::vector<const TensorInfo*>& specs) {
  std::vector<at::Tensor> out = link(from_stage).recv(from_stage, kind, micro_batch, specs);
  count();
  return out;
}

void RoutedTransport::flush() {
  for (const auto* l : {&previous_, &next_})
    if (*l) (*l)->flush();
}

void check_transport(TransportKind choice, c10::Device device) {
  if (choice == TransportKind::Mpi && device.is_cuda())
    throw ConfigError("--transport mpi sends CPU tensors; with --device cuda use auto, nccl or host");
  if (choice == TransportKind::Nccl && !device.is_cuda())
    throw ConfigError("--transport nccl moves CUDA tensors: use it with --device cuda");
  if (choice == TransportKind::Nccl && !nccl_available())
    throw ConfigError("--transport nccl: this build has no NCCL (see CMakeLists.txt); use --transport host");
}

PipelineTransport make_pipeline_transport(MPI_Comm comm, c10::Device device, TransportKind choice, LinkNeeds needs) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  check_transport(choice, device);
  if (choice == TransportKind::Nccl && needs.any_peer)
    throw ConfigError(
        "--transport nccl: an interleaved schedule sends both ways between ranks, which NCCL would "
        "match by order alone; use --transport auto or host");
  const std::vector<std::string> ids = device_identities(device, comm);
  if (choice == TransportKind::Auto && !device.is_cuda()) choice = TransportKind::Mpi;
  PipelineTransport out;
  if (choice == TransportKind::Mpi || needs.any_peer || needs.sends_in_flight > 1) {  // tagged, to any rank
    if (device.is_cuda())
      out.transport = std::make_unique<HostStagedTransport>(comm, device, needs.sends_in_flight);
    else
      out.transport = std::make_unique<MpiTransport>(comm, needs.sends_in_flight);
    out.description = device.is_cuda() ? "host" : "mpi";
    return out;
  }
  // Per link (x, x + 1): NCCL unless the two ranks share a GPU (or host staging was asked for).
  // Every rank computes every link's kind from the same identities, so both ends agree.
  std::vector<bool> nccl_link(static_cast<size_t>(std::max(size - 1, 0)));
  for (int x = 0; x + 1 < size; ++x) {
    const bool shared = ids[x] == ids[x + 1];
    if (choice == TransportKind::Nccl && shared)
      throw ConfigError("--transport nccl: ranks " + std::to_string(x) + " and " + std::to_string(x + 1) +
                        " share one GPU (" + ids[x] + "), which NCCL refuses; use --transport auto or host");
    nccl_link[x] = choice != TransportKind::Host && !shared && nccl_available();
  }
  MPI_Comm setup;  // NCCL ids travel apart from the data messages
  MPI_Comm_dup(comm, &setup);
  auto make_link = [&](int peer) -> std::unique_ptr<Transport> {
    if (peer < 0 || peer >= size) return nullptr;
    if (nccl_link[std::min(rank, peer)]) return make_nccl_link(setup, peer, device);
    return std::make_unique<HostStagedTransport>(comm, device);
  };
  // The link to the previous stage first: its NCCL setup pairs with that rank's link to its next.
  std::unique_ptr<Transport> previous = make_link(rank - 1);
  std::unique_ptr<Transport> next = make_link(rank + 1);
  MPI_Comm_free(&setup);
  out.transport = std::make_unique<RoutedTransport>(rank, std::move(previous), std::move(next));
  for (int x = 0; x + 1 < size; ++x)
    out.description +=
        (x ? ", " : "") + std::to_string(x) + "-" + std::to_string(x + 1) + (nccl_link[x] ? " nccl" : " host");
  if (size == 1) out.description = "none";
  return out;
}

}  // namespace dawnpiper
