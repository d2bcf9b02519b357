#pragma once
// Moving activations and gradients between pipeline stages. One interface, several transports:
// MPI point-to-point for CPU tensors (one rank per stage), and an in-process mailbox that lets
// one process run every stage (the single-process reference for the asynchronous schedule,
// and tests).
#include <cstdint>
#include <deque>
#include <map>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>

#include "graph/op_graph.h"

namespace dawnpiper {

// What a message carries: the ids of the graph tensors, in order. Receivers know the shapes and
// dtypes from the graph, so only raw data travels.
enum class MessageKind { Activation = 0, Gradient = 1 };

// Replaces each of a message's tensors by dense(tensor) (a contiguous copy, a host copy), once
// per distinct view: an add hands its output's gradient itself to both of its inputs, and where
// that gradient is a permuted view (the halves of a rotary sum received from the stage before)
// one copy serves both, as the planner's replay counts (two were held until the send completed).
template <class Dense>
void dense_once_per_view(std::vector<at::Tensor>& tensors, Dense dense) {
  auto same_view = [](const at::Tensor& a, const at::Tensor& b) {
    return a.storage().is_alias_of(b.storage()) && a.storage_offset() == b.storage_offset() &&
           a.sizes().equals(b.sizes()) && a.strides().equals(b.strides());
  };
  const std::vector<at::Tensor> views = tensors;
  for (size_t i = 0; i < tensors.size(); ++i) {
    size_t k = 0;
    while (k < i && !same_view(views[k], views[i])) ++k;
    tensors[i] = k < i ? tensors[k] : dense(views[i]);
  }
}

class Transport {
 public:
  virtual ~Transport() = default;
  // Starts sending; returns without waiting for the receiver. The tensors are kept alive until
  // the send completes.
  virtual void send(int to_stage, MessageKind kind, int64_t micro_batch, std::vector<at::Tensor> tensors) = 0;
  // Waits for the matching send and returns tensors of the given shapes and dtypes.
  virtual std::vector<at::Tensor> recv(int from_stage, MessageKind kind, int64_t micro_batch,
                                       const std::vector<const TensorInfo*>& specs) = 0;
  // Completes every pending send.
  virtual void flush() = 0;
  // Payload bytes moved so far.
  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t bytes_received() const { return bytes_received_; }

 protected:
  int64_t bytes_sent_ = 0, bytes_received_ = 0;
};

// Every stage in this process: a send is a deposit, a receive a withdrawal (which must follow
// its send: run the stages in a valid global order).
class LocalTransport final : public Transport {
 public:
  void send(int to_stage, MessageKind kind, int64_t micro_batch, std::vector<at::Tensor> tensors) override;
  std::vector<at::Tensor> recv(int from_stage, MessageKind kind, int64_t micro_batch,
                               const std::vector<const TensorInfo*>& specs) override;
  void flush() override {}
  // Used by the in-process runner: the sender's stage for the next send().
  void set_sender(int stage) { sender_ = stage; }

 private:
  using Key = std::tuple<int, int, int, int64_t>;  // from, to, kind, micro-batch
  std::map<Key, std::vector<at::Tensor>> mailbox_;
  int sender_ = 0;
};

// Several stages per rank (interleaved schedules): stage s lives on rank s mod ranks of
// `by_rank`, a transport whose "stages" are ranks. Two stages of one rank receive the same
// micro-batch from the same peer, so a message's micro-batch becomes micro_batch x V + the
// receiving stage's chunk (s / ranks).
class RoundRobinTransport final : public Transport {
 public:
  RoundRobinTransport(Transport& by_rank, int ranks, int virtual_stages)
      : by_rank_(by_rank), ranks_(ranks), virtual_stages_(virtual_stages) {}
  void send(int to_stage, MessageKind kind, int64_t micro_batch, std::vector<at::Tensor> tensors) override;
  std::vector<at::Tensor> recv(int from_stage, MessageKind kind, int64_t micro_batch,
                               const std::vector<const TensorInfo*>& specs) override;
  void flush() override { by_rank_.flush(); }

 private:
  int64_t message(int to_stage, int64_t micro_batch) const { return micro_batch * virtual_stages_ + to_stage / ranks_; }
  Transport& by_rank_;
  int ranks_, virtual_stages_;
};

// For running one stage alone (run-stage): receives return stand-in tensors of the right
// shapes and dtypes (small positive random values; zeros for integers unless set_exact gives them), sends are counted
// and held until the next send (the latest an MPI send completes, as the planner's memory replay assumes; with
// `sends_in_flight` sends going on at once, until that many later sends), as contiguous copies where MPI would need
// one (transposed views).
class StandInTransport final : public Transport {
 public:
  explicit StandInTransport(at::Device device = at::Device(at::kCPU), uint64_t seed = 7, int sends_in_flight = 1)
      : device_(device), seed_(seed), sends_in_flight_(sends_in_flight) {}
  void send(int to_stage, MessageKind kind, int64_t micro_batch, std::vector<at::Tensor> tensors) override;
  std::vector<at::Tensor> recv(int from_stage, MessageKind kind, int64_t micro_batch,
                               const std::vector<const TensorInfo*>& specs) override;
  void flush() override { in_flight_.clear(); }
  // Received tensors to give exactly (by graph tensor id) instead of stand-ins: those no
  // parameter feeds, whose values index or mask (a random relative position would become an
  // index out of range). See exact_constant_inputs (runtime/pipeline.h).
  void set_exact(std::map<int, at::Tensor> exact) { exact_ = std::move(exact); }

 private:
  at::Device device_;
  uint64_t seed_;
  size_t sends_in_flight_;
  std::deque<std::vector<at::Tensor>> in_flight_;  // the latest sends, oldest first
  std::map<int, at::Tensor> exact_;
};

}  // namespace dawnpiper
