#include "runtime/zero_shard.h"

#include <ATen/core/grad_mode.h>

#include <climits>
#include <deque>
#include <stdexcept>
#include <string>

#include "runtime/mpi_wait.h"
#include "train/grad_norm.h"
#include "train/optimizer.h"

namespace dawnpiper {

ShardLayout shard_layout(const std::vector<int64_t>& numels, int64_t bucket_numel, int replicas, int replica) {
  if (replicas < 1 || replica < 0 || replica >= replicas) throw std::logic_error("shard_layout: bad replica");
  ShardLayout l;
  l.replicas = replicas;
  l.replica = replica;
  int64_t flat = 0;
  for (int64_t n : numels) l.param_offset.push_back(flat), flat += n;
  for (size_t i = 0; i < numels.size();) {
    ShardLayout::Bucket b;
    b.begin = l.param_offset[i];
    b.first_param = i;
    do b.numel += numels[i++];
    while (i < numels.size() && b.numel < bucket_numel);
    b.end_param = i;
    if (b.numel == 0) continue;  // parameters without elements
    b.chunk = (b.numel + replicas - 1) / replicas;
    b.shard_offset = l.shard_numel;
    l.shard_numel += b.chunk;
    // This replica's chunk in the flat space, cut by the parameters it meets.
    const int64_t lo = b.begin + replica * b.chunk, hi = std::min(b.begin + b.numel, lo + b.chunk);
    for (size_t p = b.first_param; p < b.end_param; ++p) {
      const int64_t from = std::max(lo, l.param_offset[p]), to = std::min(hi, l.param_offset[p] + numels[p]);
      if (from < to) l.pieces.push_back({p, from - l.param_offset[p], to - from, b.shard_offset + (from - lo)});
    }
    l.buckets.push_back(b);
  }
  return l;
}

namespace {

int mpi_count(int64_t n) {
  if (n > INT_MAX)
    throw std::runtime_error("a ZeRO bucket chunk of " + std::to_string(n) + " elements: lower --bucket-size");
  return static_cast<int>(n);
}

// At most two buckets in flight: one is filled (or emptied) while the one before travels.
constexpr size_t kInFlight = 2;

}  // namespace

ZeroShard::ZeroShard(std::vector<at::Tensor> params, std::vector<bool> counted, MPI_Comm replicas, int64_t bucket_bytes)
    : params_(std::move(params)), comm_(replicas) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm_, &rank);
  MPI_Comm_size(comm_, &size);
  std::vector<int64_t> numels;
  for (const at::Tensor& p : params_) {
    if (p.scalar_type() != at::kFloat || !p.is_contiguous() || !p.device().is_cpu())
      throw std::logic_error("ZeRO shards contiguous fp32 parameters in host memory");
    numels.push_back(p.numel());
  }
  layout_ = shard_layout(numels, std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(sizeof(float))), size, rank);
  at::NoGradGuard no_grad;
  for (const ShardLayout::Piece& piece : layout_.pieces) {
    const at::Tensor& p = params_[piece.param];
    at::Tensor view = p.detach().view({-1}).narrow(0, piece.offset, piece.numel);
    // Two dimensions where the parameter decays: the optimizer groups by dimensions.
    pieces_.push_back(decays(p.dim()) ? view.view({1, piece.numel}) : view);
    piece_counted_.push_back(counted.empty() || counted[piece.param]);
  }
}

int64_t ZeroShard::reduce_scatter() {
  at::NoGradGuard no_grad;
  shard_grad_ = at::empty({layout_.shard_numel}, at::kFloat);  // every element is received
  struct Sending {
    at::Tensor buffer;
    MPI_Request request;
  };
  std::deque<Sending> sending;
  int64_t bytes = 0;
  for (const ShardLayout::Bucket& b : layout_.buckets) {
    at::Tensor buffer = at::empty({b.chunk * layout_.replicas}, at::kFloat);
    for (size_t p = b.first_param; p < b.end_param; ++p) {
      at::Tensor part = buffer.narrow(0, layout_.param_offset[p] - b.begin, params_[p].numel());
      const at::Tensor& g = params_[p].grad();
      if (g.defined())
        part.copy_(g.reshape({-1}));
      else
        part.zero_();
      params_[p].mutable_grad() = at::Tensor();  // the bucket holds it now
    }
    buffer.narrow(0, b.numel, buffer.numel() - b.numel).zero_();
    sending.push_back({buffer, MPI_REQUEST_NULL});
    MPI_Ireduce_scatter_block(buffer.data_ptr<float>(), shard_grad_.data_ptr<float>() + b.shard_offset,
                              mpi_count(b.chunk), MPI_FLOAT, MPI_SUM, comm_, &sending.back().request);
    bytes += buffer.nbytes();
    if (sending.size() >= kInFlight) wait_quietly(sending.front().request), sending.pop_front();
  }
  for (Sending& s : sending) wait_quietly(s.request);
  sending.clear();
  shard_grad_.div_(static_cast<double>(layout_.replicas));
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const ShardLayout::Piece& piece = layout_.pieces[k];
    pieces_[k].mutable_grad() = shard_grad_.narrow(0, piece.shard_offset, piece.numel).view(pieces_[k].sizes());
  }
  return bytes;
}

double ZeroShard::grad_square_sum() const {
  double sum = dawnpiper::grad_square_sum(pieces_, piece_counted_);
  allreduce_quietly(&sum, 1, MPI_DOUBLE, MPI_SUM, comm_);
  return sum;
}

int64_t ZeroShard::all_gather() {
  at::NoGradGuard no_grad;
  // The optimizer has let go of the pieces' gradients; the shard's buffer goes with them.
  for (at::Tensor& piece : pieces_) piece.mutable_grad() = at::Tensor();
  shard_grad_ = at::Tensor();
  struct Gathering {
    const ShardLayout::Bucket* bucket;
    at::Tensor send, receive;
    MPI_Request request;
  };
  std::deque<Gathering> gathering;
  auto finish = [&](Gathering& g) {
    wait_quietly(g.request);
    const ShardLayout::Bucket& b = *g.bucket;
    for (size_t p = b.first_param; p < b.end_param; ++p)
      params_[p].detach().view({-1}).copy_(g.receive.narrow(0, layout_.param_offset[p] - b.begin, params_[p].numel()));
  };
  int64_t bytes = 0;
  size_t k = 0;  // the next piece, in flat order
  for (const ShardLayout::Bucket& b : layout_.buckets) {
    at::Tensor send = at::zeros({b.chunk}, at::kFloat);
    for (; k < pieces_.size() && layout_.pieces[k].shard_offset < b.shard_offset + b.chunk; ++k)
      send.narrow(0, layout_.pieces[k].shard_offset - b.shard_offset, layout_.pieces[k].numel)
          .copy_(pieces_[k].reshape({-1}));
    at::Tensor receive = at::empty({b.chunk * layout_.replicas}, at::kFloat);
    gathering.push_back({&b, send, receive, MPI_REQUEST_NULL});
    MPI_Iallgather(send.data_ptr<float>(), mpi_count(b.chunk), MPI_FLOAT, receive.data_ptr<float>(), mpi_count(b.chunk),
                   MPI_FLOAT, comm_, &gathering.back().request);
    bytes += receive.nbytes();
    if (gathering.size() >= kInFlight) finish(gathering.front()), gathering.pop_front();
  }
  for (Gathering& g : gathering) finish(g);
  return bytes;
}

}  // namespace dawnpiper
