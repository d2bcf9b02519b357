#include "runtime/mpi_transport.h"
#include "runtime/transport.h"

#include <ATen/CPUGeneratorImpl.h>

#include <stdexcept>

#include "util/error.h"

namespace dawnpiper {

namespace {
at::ScalarType scalar_type(DType d) { return d == DType::I64 ? at::kLong : at::kFloat; }

// All tensors of a message packed into one contiguous byte buffer (one MPI message).
at::Tensor pack(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : tensors) flat.push_back(t.contiguous().view({-1}).view(at::kByte));
  return flat.size() == 1 ? flat[0] : at::cat(flat);
}
}  // namespace

void LocalTransport::send(int to_stage, MessageKind kind, int64_t micro_batch, std::vector<at::Tensor> tensors) {
  for (at::Tensor& t : tensors) {
    t = t.detach().clone();  // what the receiver gets must not alias the sender's tensors
    bytes_sent_ += t.numel() * t.element_size();
  }
  mailbox_[Key{sender_, to_stage, static_cast<int>(kind), micro_batch}] = std::move(tensors);
}

std::vector<at::Tensor> LocalTransport::recv(int from_stage, MessageKind kind, int64_t micro_batch,
                                             const std::vector<const TensorInfo*>& specs) {
  auto it = mailbox_.find(Key{from_stage, sender_, static_cast<int>(kind), micro_batch});
  if (it == mailbox_.end())
    throw std::logic_error("in-process pipeline: receive before its send (stage " + std::to_string(sender_) +
                           ", micro-batch " + std::to_string(micro_batch) + ")");
  std::vector<at::Tensor> out = std::move(it->second);
  if (out.size() != specs.size()) throw std::logic_error("in-process pipeline: message of the wrong size");
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i].sizes().vec() != specs[i]->shape) throw std::logic_error("in-process pipeline: wrong tensor shape");
  mailbox_.erase(it);
  for (const at::Tensor& t : out) bytes_received_ += t.numel() * t.element_size();
  return out;
}

void StandInTransport::send(int, MessageKind, int64_t, std::vector<at::Tensor> tensors) {
  for (const at::Tensor& t : tensors) bytes_sent_ += t.numel() * t.element_size();
}

std::vector<at::Tensor> StandInTransport::recv(int, MessageKind, int64_t micro_batch,
                                               const std::vector<const TensorInfo*>& specs) {
  at::Generator gen = at::detail::createCPUGenerator(seed_ + static_cast<uint64_t>(micro_batch));
  std::vector<at::Tensor> out;
  for (const TensorInfo* s : specs) {
    const at::ScalarType type = scalar_type(s->dtype);
    out.push_back(at::isFloatingType(type) ? at::randn(s->shape, gen, at::TensorOptions(type)) * 0.02
                                           : at::zeros(s->shape, at::TensorOptions(type)));
    bytes_received_ += s->bytes();
  }
  return out;
}

MpiTransport::MpiTransport(MPI_Comm comm) : comm_(comm) {
  void* value = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(comm, MPI_TAG_UB, &value, &flag);
  if (flag) tag_ub_ = *static_cast<int*>(value);
}

MpiTransport::~MpiTransport() {
  try {
    flush();
  } catch (...) {
  }
}

int MpiTransport::tag(MessageKind kind, int64_t micro_batch) const {
  const int64_t t = micro_batch * 2 + static_cast<int>(kind);
  if (t > tag_ub_)
    throw Error("too many micro-batches for MPI tags (" + std::to_string(micro_batch) + "); run fewer steps");
  return static_cast<int>(t);
}

void MpiTransport::send(int to_stage, MessageKind kind, int64_t micro_batch, std::vector<at::Tensor> tensors) {
  reap();
  at::Tensor buffer = pack(tensors);
  Pending p{MPI_REQUEST_NULL, buffer};
  MPI_Isend(buffer.data_ptr(), static_cast<int>(buffer.numel()), MPI_BYTE, to_stage, tag(kind, micro_batch),
            comm_, &p.request);
  bytes_sent_ += buffer.numel();
  pending_.push_back(std::move(p));
}

std::vector<at::Tensor> MpiTransport::recv(int from_stage, MessageKind kind, int64_t micro_batch,
                                           const std::vector<const TensorInfo*>& specs) {
  reap();
  int64_t total = 0;
  for (const TensorInfo* s : specs) total += s->bytes();
  at::Tensor buffer = at::empty({total}, at::kByte);
  MPI_Status status;
  MPI_Recv(buffer.data_ptr(), static_cast<int>(total), MPI_BYTE, from_stage, tag(kind, micro_batch), comm_, &status);
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  if (count != total)
    throw std::logic_error("stage message of " + std::to_string(count) + " bytes, expected " + std::to_string(total));
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const TensorInfo* s : specs) {
    const int64_t n = s->bytes();
    // A copy per tensor, so each owns its storage (and is freed on its own).
    out.push_back(buffer.narrow(0, offset, n).view(scalar_type(s->dtype)).view(s->shape).clone());
    offset += n;
  }
  bytes_received_ += total;
  return out;
}

void MpiTransport::reap() {
  while (!pending_.empty()) {
    int done = 0;
    MPI_Test(&pending_.front().request, &done, MPI_STATUS_IGNORE);
    if (!done) break;
    pending_.pop_front();
  }
}

void MpiTransport::flush() {
  for (Pending& p : pending_) MPI_Wait(&p.request, MPI_STATUS_IGNORE);
  pending_.clear();
}

}  // namespace dawnpiper
