#include "runtime/mpi_transport.h"
#include "runtime/transport.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <stdexcept>

#include "data/scalar_type.h"
#include "runtime/mpi_wait.h"
#include "util/error.h"

namespace dawnpiper {

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

void RoundRobinTransport::send(int to_stage, MessageKind kind, int64_t micro_batch, std::vector<at::Tensor> tensors) {
  by_rank_.send(to_stage % ranks_, kind, message(to_stage, micro_batch), std::move(tensors));
  bytes_sent_ = by_rank_.bytes_sent();
}

std::vector<at::Tensor> RoundRobinTransport::recv(int from_stage, MessageKind kind, int64_t micro_batch,
                                                  const std::vector<const TensorInfo*>& specs) {
  const int to_stage = kind == MessageKind::Activation ? from_stage + 1 : from_stage - 1;
  std::vector<at::Tensor> out = by_rank_.recv(from_stage % ranks_, kind, message(to_stage, micro_batch), specs);
  bytes_received_ = by_rank_.bytes_received();
  return out;
}

void StandInTransport::send(int, MessageKind, int64_t, std::vector<at::Tensor> tensors) {
  // As MpiTransport: the oldest send completes before this one copies anything.
  while (in_flight_.size() >= sends_in_flight_) in_flight_.pop_front();
  dense_once_per_view(tensors, [](const at::Tensor& t) { return t.contiguous(); });
  for (const at::Tensor& t : tensors) bytes_sent_ += t.numel() * t.element_size();
  in_flight_.push_back(std::move(tensors));
}

std::vector<at::Tensor> StandInTransport::recv(int, MessageKind, int64_t micro_batch,
                                               const std::vector<const TensorInfo*>& specs) {
  at::Generator gen = at::detail::createCPUGenerator(seed_ + static_cast<uint64_t>(micro_batch));
  std::vector<at::Tensor> out;
  for (const TensorInfo* s : specs) {
    const at::ScalarType type = scalar_type(s->dtype);
    auto exact = exact_.find(s->id);
    if (exact != exact_.end()) {
      out.push_back(exact->second.clone().to(device_));
      bytes_received_ += s->bytes();
      continue;
    }
    // Small positive values: a stand-in for a variance or a norm must not be negative (rsqrt, log).
    // Drawn in place: one buffer, as a real receive allocates (rand * a + b made two more,
    // which a stage's measured peak then counted at a large received gradient).
    at::Tensor t = at::empty(s->shape, at::TensorOptions(type));
    if (at::isFloatingType(type))
      t.uniform_(0.01, 0.03, gen);
    else
      t.zero_();
    out.push_back(t.to(device_));
    bytes_received_ += s->bytes();
  }
  return out;
}

namespace {

// Messages a tensor of n bytes travels as: one per started chunk, and one (empty) for none.
int64_t chunk_count(int64_t n) { return std::max<int64_t>(1, (n + kMessageChunkBytes - 1) / kMessageChunkBytes); }

}  // namespace

MpiTransport::MpiTransport(MPI_Comm comm, int sends_in_flight) : comm_(comm), sends_in_flight_(sends_in_flight) {
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
  // The previous send (of the last sends_in_flight) completes first, and only then is its buffer
  // released: the planner's memory replay holds a sent buffer exactly until the stage's next send
  // (earlier, by timing, would make the measured peak depend on the other ranks' speed), and a
  // receiver running behind must not let sends pile up beyond it.
  while (static_cast<int>(pending_.size()) >= sends_in_flight_) complete_oldest();
  // Straight from each tensor's storage (no packed copy), in chunks that MPI keeps in order; the
  // tensor stays referenced until its chunks are done.
  Pending& sent = pending_.emplace_back();
  dense_once_per_view(tensors, [](const at::Tensor& t) { return t.contiguous(); });
  for (at::Tensor& buffer : tensors) {
    const int64_t n = buffer.numel() * buffer.element_size();
    auto* bytes = static_cast<const char*>(buffer.data_ptr());
    for (int64_t offset = 0, c = 0; c < chunk_count(n); ++c, offset += kMessageChunkBytes) {
      const int count = static_cast<int>(std::min(kMessageChunkBytes, n - offset));
      sent.requests.push_back(MPI_REQUEST_NULL);
      MPI_Isend(bytes + offset, count, MPI_BYTE, to_stage, tag(kind, micro_batch), comm_, &sent.requests.back());
    }
    bytes_sent_ += n;
    sent.buffers.push_back(std::move(buffer));
  }
}

std::vector<at::Tensor> MpiTransport::recv(int from_stage, MessageKind kind, int64_t micro_batch,
                                           const std::vector<const TensorInfo*>& specs) {
  // Every chunk of every tensor posted at once, in the order they were sent.
  std::vector<at::Tensor> out;
  std::vector<MPI_Request> requests;
  std::vector<int64_t> expected;  // bytes per chunk
  for (const TensorInfo* s : specs) {
    at::Tensor t = at::empty(s->shape, at::TensorOptions(scalar_type(s->dtype)));
    const int64_t n = s->bytes();
    auto* bytes = static_cast<char*>(t.data_ptr());
    for (int64_t offset = 0, c = 0; c < chunk_count(n); ++c, offset += kMessageChunkBytes) {
      expected.push_back(std::min(kMessageChunkBytes, n - offset));
      requests.push_back(MPI_REQUEST_NULL);
      MPI_Irecv(bytes + offset, static_cast<int>(expected.back()), MPI_BYTE, from_stage, tag(kind, micro_batch), comm_,
                &requests.back());
    }
    bytes_received_ += n;
    out.push_back(std::move(t));
  }
  std::vector<MPI_Status> statuses;
  wait_all_quietly(requests, &statuses);
  for (size_t i = 0; i < statuses.size(); ++i) {
    int count = 0;
    MPI_Get_count(&statuses[i], MPI_BYTE, &count);
    if (count != expected[i])
      throw std::logic_error("stage message chunk of " + std::to_string(count) + " bytes, expected " +
                             std::to_string(expected[i]));
  }
  return out;
}

void MpiTransport::complete_oldest() {
  wait_all_quietly(pending_.front().requests);
  pending_.pop_front();
}

void MpiTransport::flush() {
  while (!pending_.empty()) complete_oldest();
}

}  // namespace dawnpiper
