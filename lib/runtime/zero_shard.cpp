#include "runtime/zero_shard.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <stdexcept>
#include <string>

#include "runtime/replica_collectives.h"
#include "train/grad_norm.h"
#include "train/optimizer.h"

namespace dawnpiper {

ShardLayout shard_layout(const std::vector<int64_t>& numels, int64_t bucket_numel, int replicas, int replica,
                         const std::vector<int>& groups) {
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
    while (i < numels.size() && (b.numel < bucket_numel || (!groups.empty() && groups[i] == groups[i - 1])));
    b.end_param = i;
    if (b.numel == 0) continue;  // parameters without elements
    b.chunk = (b.numel + replicas - 1) / replicas;
    b.shard_offset = l.shard_numel;
    l.shard_numel += b.chunk;
    // This replica's chunk in the flat space, cut by the parameters it meets.
    const int64_t lo = b.begin + replica * b.chunk, hi = std::min(b.begin + b.numel, lo + b.chunk);
    for (size_t p = b.first_param; p < b.end_param; ++p) {
      const int64_t from = std::max(lo, l.param_offset[p]), to = std::min(hi, l.param_offset[p] + numels[p]);
      if (from < to)
        l.pieces.push_back({p, from - l.param_offset[p], to - from, b.shard_offset + (from - lo), l.buckets.size()});
    }
    l.buckets.push_back(b);
  }
  return l;
}

namespace {

// At most two buckets in flight: one is filled (or emptied) while the one before travels.
constexpr size_t kInFlight = 2;

// A level-3 bucket's storage takes `bytes` of fresh memory from its own allocator (0: none),
// on its device; what it held goes (a gather overwrites all of it).
void set_storage_bytes(c10::StorageImpl* storage, size_t bytes) {
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

// Level 2: tells the shard that autograd accumulated its parameter's gradient.
class AccumulatedHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  AccumulatedHook(ZeroShard* shard, size_t param) : shard_(shard), param_(param) {}
  void operator()(const torch::autograd::Variable&) override { shard_->accumulated(param_); }

 private:
  ZeroShard* shard_;
  size_t param_;
};

}  // namespace

// Front to back in blocks whose bf16 source and fp32 destination never overlap, each half of what is left.
// Elements [i, i + m) in fp32 take bytes [4i, 4i + 4m), below the bf16 still unread (from byte
// 2n + 2i) where m <= (n - i) / 2; the last element goes through a copy.
void widen_bf16_in_place(const c10::Storage& storage, int64_t n, c10::Device device) {
  at::Tensor out = at::empty({0}, at::TensorOptions(at::kFloat).device(device));
  at::Tensor in = at::empty({0}, at::TensorOptions(at::kBFloat16).device(device));
  out.set_(storage, 0, {n}, {1});
  in.set_(storage, n, {n}, {1});  // (bf16 elements: byte 2n on)
  int64_t i = 0;
  for (int64_t m = n / 2; m >= 1; i += m, m = (n - i) / 2) out.narrow(0, i, m).copy_(in.narrow(0, i, m));
  if (i < n) out.narrow(0, i, n - i).copy_(in.narrow(0, i, n - i).clone());
}

ZeroShard::ZeroShard(std::vector<at::Tensor> params, std::vector<bool> counted, MPI_Comm replicas, int64_t bucket_bytes,
                     int level, std::vector<bool> deferred, const std::vector<int>& nodes,
                     const std::vector<std::vector<int>>& reads, at::ScalarType gather_type)
    : params_(std::move(params)), comm_(replicas), level_(level), gather_type_(gather_type) {
  if (level_ < 1 || level_ > 3) throw std::logic_error("ZeroShard: level 1, 2 or 3");
  if (gather_type_ != at::kFloat && gather_type_ != at::kBFloat16) throw std::logic_error("ZeRO gathers fp32 or bf16");
  std::vector<int64_t> numels;
  if (!params_.empty()) device_ = params_.front().device();
  for (const at::Tensor& p : params_) {
    if (p.scalar_type() != at::kFloat || !p.is_contiguous() || p.device() != device_)
      throw std::logic_error("ZeRO shards contiguous fp32 parameters on one device");
    numels.push_back(p.numel());
  }
  collectives_ = make_replica_collectives(comm_, device_);
  // DAWNPIPER_ZERO_STAGED=1 stages on the CPU too: the tests run the GPU's MPI path there.
  const char* force = std::getenv("DAWNPIPER_ZERO_STAGED");
  staged_ = !collectives_->on_device() && (!device_.is_cpu() || (force != nullptr && std::string(force) == "1"));
  layout_ = shard_layout(numels, std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(sizeof(float))),
                         collectives_->replicas(), collectives_->replica(), nodes);
  at::NoGradGuard no_grad;
  if (level_ >= 3) shard_ = at::zeros({layout_.shard_numel}, on_device());
  for (const ShardLayout::Piece& piece : layout_.pieces) {
    const at::Tensor& p = params_[piece.param];
    at::Tensor view = p.detach().view({-1}).narrow(0, piece.offset, piece.numel);
    if (level_ >= 3) view = shard_.narrow(0, piece.shard_offset, piece.numel).copy_(view);  // a master of its own
    // Two dimensions where the parameter decays: the optimizer groups by dimensions.
    pieces_.push_back(decays(p.dim()) ? view.view({1, piece.numel}) : view);
    piece_counted_.push_back(counted.empty() || counted[piece.param]);
  }
  chunk_grad_.resize(layout_.buckets.size());
  armed_ = level_ >= 2;  // level 1: in the step's last weight pass (begin_pass)
  stream_buckets(deferred);
  if (level_ >= 3) gather_where_read(reads);
}

// Level 2: each bucket reduce-scattered once autograd has accumulated all its parameters, the
// deferred ones (tied across stages) last, after their sum.
void ZeroShard::stream_buckets(const std::vector<bool>& deferred) {
  const size_t buckets = layout_.buckets.size();
  bucket_of_.assign(params_.size(), -1);
  deferred_.assign(buckets, 0);
  waiting_.assign(buckets, 0);
  started_.assign(buckets, 0);
  again_.assign(buckets, 0);
  ready_.assign(params_.size(), 0);
  for (size_t b = 0; b < buckets; ++b)
    for (size_t p = layout_.buckets[b].first_param; p < layout_.buckets[b].end_param; ++p)
      if (params_[p].numel() > 0) {
        bucket_of_[p] = static_cast<int>(b);
        if (!deferred.empty() && deferred[p]) deferred_[b] = 1;
      }
  for (size_t b = buckets; b-- > 0;)
    if (!deferred_[b]) order_.push_back(b);
  restart_streaming();
  for (size_t p = 0; p < params_.size(); ++p)
    if (hooked(p))
      torch::autograd::impl::set_post_acc_grad_hooks(params_[p], std::make_unique<AccumulatedHook>(this, p));
}

// Level 3: buckets gathered before the nodes that read them (`reads`: per node offset, its
// parameters) and let go after.
void ZeroShard::gather_where_read(const std::vector<std::vector<int>>& reads) {
  const size_t buckets = layout_.buckets.size();
  // A bucket's parameters move into one storage of the bucket's padded size, empty until
  // gathered: the all-gather receives into it (nothing autograd saved is copied over).
  for (size_t b = 0; b < buckets; ++b) {
    const ShardLayout::Bucket& bucket = layout_.buckets[b];
    // (allocated while the views are set: they must lie inside it)
    c10::Storage storage(c10::Storage::use_byte_size_t(),
                         static_cast<size_t>(bucket.chunk * layout_.replicas) * sizeof(float),
                         shard_.storage().allocator(), /*resizable=*/true);  // (the device's)
    for (size_t p = bucket.first_param; p < bucket.end_param; ++p)
      if (params_[p].numel() > 0)
        params_[p].set_(storage, layout_.param_offset[p] - bucket.begin, params_[p].sizes(),
                        c10::contiguous_strides(params_[p].sizes()));
    set_storage_bytes(storage.unsafeGetStorageImpl(), 0);
    bucket_storage_.push_back(std::move(storage));
  }
  gathered_.assign(buckets, 0);
  narrow_.assign(buckets, 0);
  gathering_.resize(buckets);
  landing_.resize(buckets);
  released_on_.assign(params_.size(), 0);
  node_buckets_.resize(reads.size());
  for (size_t n = 0; n < reads.size(); ++n) {
    for (int p : reads[n])
      if (const int b = bucket_of_.at(static_cast<size_t>(p)); b >= 0)
        node_buckets_[n].push_back(static_cast<size_t>(b));
    std::sort(node_buckets_[n].begin(), node_buckets_[n].end());
    node_buckets_[n].erase(std::unique(node_buckets_[n].begin(), node_buckets_[n].end()), node_buckets_[n].end());
  }
  next_reader_.assign(reads.size(), -1);
  previous_reader_.assign(reads.size(), -1);
  for (int n = static_cast<int>(reads.size()) - 1, next = -1; n >= 0; --n) {
    next_reader_[static_cast<size_t>(n)] = next;
    if (!node_buckets_[static_cast<size_t>(n)].empty()) next = n;
  }
  for (int n = 0, previous = -1; n < static_cast<int>(reads.size()); ++n) {
    previous_reader_[static_cast<size_t>(n)] = previous;
    if (!node_buckets_[static_cast<size_t>(n)].empty()) previous = n;
  }
  count_parameters();
}

ZeroShard::~ZeroShard() {
  // (An error unwinds the stage: the collectives under way keep their tensors.)
  for (size_t p = 0; p < bucket_of_.size(); ++p)
    if (hooked(p)) torch::autograd::impl::set_post_acc_grad_hooks(params_[p], nullptr);
}

bool ZeroShard::hooked(size_t param) const {
  const int b = bucket_of_.at(param);
  return b >= 0 && (level_ >= 3 || !deferred_[static_cast<size_t>(b)]);
}

void ZeroShard::count_parameters() {
  if (gathered_.empty()) return;
  std::fill(released_on_.begin(), released_on_.end(), 0);
  unaccumulated_.assign(layout_.buckets.size(), 0);
  for (int b : bucket_of_)
    if (b >= 0) ++unaccumulated_[static_cast<size_t>(b)];
}

void ZeroShard::start_gather(size_t bucket, at::ScalarType type) {
  if (gathered_[bucket]) return;
  const ShardLayout::Bucket& b = layout_.buckets[bucket];
  const int64_t n = b.chunk * layout_.replicas;
  const c10::Storage& storage = bucket_storage_[bucket];
  set_storage_bytes(storage.unsafeGetStorageImpl(), static_cast<size_t>(n) * sizeof(float));
  at::NoGradGuard no_grad;
  at::Tensor all;  // where it gathers, this replica's chunk in its place
  if (staged_) {   // into host memory; gather() copies it over
    all = landing_[bucket] = at::empty({n}, at::TensorOptions(type));
  } else {  // into the storage (bf16: its upper half, widened where waited for)
    all = at::empty({0}, at::TensorOptions(type).device(device_));
    all.set_(storage, type == at::kFloat ? 0 : n, {n}, {1});
    narrow_[bucket] = type != at::kFloat;
  }
  all.narrow(0, layout_.replica * b.chunk, b.chunk).copy_(shard_.narrow(0, b.shard_offset, b.chunk));
  gathering_[bucket] = collectives_->all_gather(all);
  gathered_bytes_ += n * static_cast<int64_t>(at::elementSize(type));
  gathered_[bucket] = 1;
}

void ZeroShard::gather(size_t bucket) {
  start_gather(bucket, gather_type_);
  if (gathering_[bucket]) gathering_[bucket]->wait(), gathering_[bucket].reset();
  if (landing_[bucket].defined()) {  // staged: onto the device, widened to fp32 on the way
    at::NoGradGuard no_grad;
    const int64_t n = layout_.buckets[bucket].chunk * layout_.replicas;
    at::Tensor whole = at::empty({0}, on_device());
    whole.set_(bucket_storage_[bucket], 0, {n}, {1});
    whole.copy_(landing_[bucket]);
    landing_[bucket] = at::Tensor();
  }
  if (narrow_[bucket]) {
    at::NoGradGuard no_grad;
    widen_bf16_in_place(bucket_storage_[bucket], layout_.buckets[bucket].chunk * layout_.replicas, device_);
    narrow_[bucket] = 0;
  }
}

void ZeroShard::release(size_t bucket) {
  if (!gathered_[bucket]) return;
  if (gathering_[bucket]) gathering_[bucket]->wait(), gathering_[bucket].reset();  // (never read: a reader skipped)
  landing_[bucket] = at::Tensor();
  set_storage_bytes(bucket_storage_[bucket].unsafeGetStorageImpl(), 0);
  gathered_[bucket] = narrow_[bucket] = 0;
}

void ZeroShard::test_gathers() {
  // Open MPI advances a non-blocking collective only inside MPI calls: the gathers under way
  // move on between nodes.
  for (std::unique_ptr<ReplicaCollective>& g : gathering_)
    if (g) g->test();
}

void ZeroShard::gather_param(size_t param) {
  if (const int b = bucket_of_.at(param); b >= 0) gather(static_cast<size_t>(b));
}

std::vector<size_t> ZeroShard::buckets_read(size_t node, const std::vector<at::Tensor>& inputs) const {
  std::vector<size_t> read = node_buckets_.at(node);
  for (const at::Tensor& t : inputs)
    for (size_t b = 0; b < bucket_storage_.size(); ++b)
      if (views(t, b)) read.push_back(b);
  std::sort(read.begin(), read.end());
  read.erase(std::unique(read.begin(), read.end()), read.end());
  return read;
}

bool ZeroShard::views(const at::Tensor& t, size_t bucket) const {
  return t.defined() && t.has_storage() &&
         t.storage().unsafeGetStorageImpl() == bucket_storage_[bucket].unsafeGetStorageImpl();
}

bool ZeroShard::views_gathered(const at::Tensor& t) const {
  for (size_t b = 0; b < gathered_.size(); ++b)
    if (gathered_[b] && views(t, b)) return true;
  return false;
}

void ZeroShard::let_go_viewed(const std::vector<at::Tensor>& tensors) {
  for (size_t b = 0; b < gathered_.size(); ++b)
    if (gathered_[b] && std::any_of(tensors.begin(), tensors.end(), [&](const at::Tensor& t) { return views(t, b); }))
      release(b);
}

void ZeroShard::before_backward_node(size_t node, const std::vector<size_t>& buckets) {
  test_gathers();
  for (size_t b : buckets) gather(b);
  if (input_pass_ && input_pass_node_.at(node) == 0) {
    input_pass_node_[node] = 1;
    for (size_t b : buckets) ++input_pass_readers_[b];
  }
  // One reader ahead: autograd runs the stage's nodes from the last, so the next to read
  // parameters is the reader before this one.
  ahead_reader_ = previous_reader_.at(node);
  if (ahead_reader_ >= 0)
    for (size_t b : node_buckets_[static_cast<size_t>(ahead_reader_)]) start_gather(b, gather_type_);
}

void ZeroShard::begin_input_pass() {
  input_pass_ = true;
  input_pass_node_.assign(node_buckets_.size(), 0);
  input_pass_readers_.assign(layout_.buckets.size(), 0);
  ahead_reader_ = -1;
}

void ZeroShard::end_input_pass() {
  input_pass_ = false;
  release_all();
}

void ZeroShard::inputs_gradient_made(size_t node, const std::vector<size_t>& buckets) {
  if (!input_pass_ || input_pass_node_.at(node) != 1) return;
  input_pass_node_[node] = 2;
  // (the buckets gathered ahead for a reader that has not gathered yet stay)
  const bool ahead_waits = ahead_reader_ >= 0 && input_pass_node_[static_cast<size_t>(ahead_reader_)] == 0;
  const std::vector<size_t>* ahead = ahead_waits ? &node_buckets_[static_cast<size_t>(ahead_reader_)] : nullptr;
  for (size_t b : buckets)
    if (--input_pass_readers_[b] == 0 && (!ahead || !std::binary_search(ahead->begin(), ahead->end(), b))) release(b);
}

void ZeroShard::before_forward_node(size_t node, const std::vector<at::Tensor>& env) {
  test_gathers();
  const bool reads = node < next_reader_.size() && !node_buckets_[node].empty();
  const int next = node < next_reader_.size() ? (reads ? static_cast<int>(node) : next_reader_[node]) : -1;
  // One reader ahead: a reader's buckets, and those of the reader after it, which travel while
  // it computes.
  const int ahead = reads ? next_reader_[node] : -1;
  auto kept = [&](int reader, size_t b) {
    if (reader < 0) return false;
    const std::vector<size_t>& keep = node_buckets_[static_cast<size_t>(reader)];
    return std::binary_search(keep.begin(), keep.end(), b);
  };
  for (size_t b = 0; b < gathered_.size(); ++b) {
    if (!gathered_[b] || kept(next, b) || kept(ahead, b)) continue;
    if (std::none_of(env.begin(), env.end(), [&](const at::Tensor& t) { return views(t, b); })) release(b);
  }
  if (!reads) return;
  for (size_t b : node_buckets_[node]) start_gather(b, gather_type_);  // (its parameter gate waits for them)
  if (ahead >= 0)
    for (size_t b : node_buckets_[static_cast<size_t>(ahead)]) start_gather(b, gather_type_);
}

void ZeroShard::gather_all() {
  if (level_ < 3) {  // in fp32 the parameters are the masters already
    if (gather_type_ != at::kFloat) gather_chunks(at::kFloat);
    return;
  }
  for (size_t b = 0; b < gathered_.size(); ++b) {
    if (gather_type_ != at::kFloat) release(b);  // again, in fp32
    start_gather(b, at::kFloat);
  }
  for (size_t b = 0; b < gathered_.size(); ++b) gather(b);
}

void ZeroShard::release_all() {
  for (size_t b = 0; b < gathered_.size(); ++b) release(b);
}

void ZeroShard::keep_parameters() {
  if (level_ < 3) return;  // (below, the pieces view the parameters)
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const ShardLayout::Piece& piece = layout_.pieces[k];
    pieces_[k].view({-1}).copy_(params_[piece.param].detach().view({-1}).narrow(0, piece.offset, piece.numel));
  }
}

void ZeroShard::start(size_t bucket) {
  at::NoGradGuard no_grad;
  const ShardLayout::Bucket& b = layout_.buckets[bucket];
  // (packed where the collective reads it: in host memory unless it runs on the device)
  at::Tensor buffer = at::empty({b.chunk * layout_.replicas}, collectives_->on_device() ? on_device() : at::kFloat);
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
  // The reduction overwrites this replica's chunk of the shard: its sum so far in the step travels
  // along. The chunk is allocated at the bucket's first start in the step.
  at::Tensor& chunk = chunk_grad_[bucket];
  if (chunk.defined()) {
    for (Travelling& t : travelling_)  // (a bucket going again: its first reduction lands first)
      if (t.chunk.is_same(chunk)) land(t);
    buffer.narrow(0, layout_.replica * b.chunk, b.chunk).add_(chunk.to(buffer.device()));  // (there: as it is)
  } else
    chunk = at::empty({b.chunk}, on_device());
  // Staged: received in host memory, copied onto the device where it lands.
  const at::Tensor landing = staged_ ? at::empty({b.chunk}, at::kFloat) : chunk;
  travelling_.push_back(
      {buffer, chunk, landing, collectives_->reduce_scatter(buffer, landing), bucket, Clock::now(), {}, false});
  sent_bytes_ += buffer.nbytes();
  if (travelling_.size() >= kInFlight) finish_oldest();
}

void ZeroShard::wait(Travelling& t) {
  if (t.end != Clock::time_point{}) return;
  t.request->wait();
  t.end = Clock::now();
}

void ZeroShard::land(Travelling& t) {
  wait(t);
  if (t.landed) return;
  if (!t.landing.is_same(t.chunk)) {
    at::NoGradGuard no_grad;
    t.chunk.copy_(t.landing);
  }
  t.landed = true;
}

void ZeroShard::finish_oldest() {
  Travelling& t = travelling_.front();
  land(t);
  if (listener_) listener_(static_cast<int>(t.bucket), t.buffer.nbytes(), t.start, t.end);
  travelling_.pop_front();
}

void ZeroShard::accumulated(size_t param) {
  const int b = bucket_of_.at(param);
  if (b < 0) return;
  const size_t bucket = static_cast<size_t>(b);
  if (!gathered_.empty() && !released_on_[param]) {  // level 3: no function reads it after this
    released_on_[param] = 1;
    if (--unaccumulated_[bucket] == 0) release(bucket);
  }
  if (deferred_[bucket] || !armed_) return;  // (level 3 hooks them too) they wait for the update
  test_travelling();
  if (started_[bucket]) {  // accumulated again (a parameter two weight passes reach): goes again
    again_[bucket] = 1;
    return;
  }
  if (!ready_[param]) ready_[param] = 1, --waiting_[bucket];
  while (next_ < order_.size() && waiting_[order_[next_]] == 0) {
    started_[order_[next_]] = 1;
    start(order_[next_++]);
  }
}

void ZeroShard::test_travelling() {
  // (Open MPI advances them only inside MPI calls: between two accumulations)
  for (Travelling& t : travelling_) {
    if (t.end != Clock::time_point{}) continue;
    if (t.request->test()) t.end = Clock::now();
  }
}

void ZeroShard::begin_pass(bool last) {
  if (level_ == 1) armed_ = last;
}

void ZeroShard::end_micro_batch() {
  if (!armed_) return;  // level 1: not the step's last weight pass
  for (; next_ < order_.size(); ++next_) started_[order_[next_]] = 1, start(order_[next_]);
  for (size_t b : order_)
    if (again_[b]) start(b);
  // Level 1: the last buckets travel while the pipeline drains; the update waits for them.
  if (level_ >= 2)
    while (!travelling_.empty()) finish_oldest();
  if (level_ == 1) armed_ = false;
  restart_streaming();
}

void ZeroShard::restart_streaming() {
  next_ = 0;
  std::fill(started_.begin(), started_.end(), 0);
  std::fill(again_.begin(), again_.end(), 0);
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(waiting_.begin(), waiting_.end(), 0);
  for (size_t p = 0; p < params_.size(); ++p)
    if (bucket_of_[p] >= 0) ++waiting_[static_cast<size_t>(bucket_of_[p])];
  release_all();  // level 3
  count_parameters();
}

int64_t ZeroShard::reduce_scatter() {
  at::NoGradGuard no_grad;
  // The streamed buckets are in the shard already (level 1: those of the step's last weight pass,
  // some still travelling); the deferred ones, and every bucket where nothing streamed, join it.
  for (size_t b = 0; b < layout_.buckets.size(); ++b)
    if (deferred_[b] || !chunk_grad_[b].defined()) start(b);
  while (!travelling_.empty()) finish_oldest();
  for (at::Tensor& chunk : chunk_grad_) chunk.div_(static_cast<double>(layout_.replicas));
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const ShardLayout::Piece& piece = layout_.pieces[k];
    const int64_t offset = piece.shard_offset - layout_.buckets[piece.bucket].shard_offset;
    pieces_[k].mutable_grad() = chunk_grad_[piece.bucket].narrow(0, offset, piece.numel).view(pieces_[k].sizes());
  }
  const int64_t bytes = sent_bytes_;
  sent_bytes_ = 0;
  return bytes;
}

double ZeroShard::grad_square_sum() const {
  return collectives_->sum(dawnpiper::grad_square_sum(pieces_, piece_counted_));
}

void ZeroShard::all_gather() {
  at::NoGradGuard no_grad;
  // The optimizer has let go of the pieces' gradients; the shard's buffer goes with them.
  for (at::Tensor& piece : pieces_) piece.mutable_grad() = at::Tensor();
  for (at::Tensor& chunk : chunk_grad_) chunk = at::Tensor();
  if (level_ < 3) gather_chunks(gather_type_);  // (level 3: each use gathers)
}

void ZeroShard::gather_chunks(at::ScalarType type) {
  at::NoGradGuard no_grad;
  struct Gathering {
    const ShardLayout::Bucket* bucket;
    at::Tensor buffer;  // every replica's chunk, this one's sent from its place
    std::unique_ptr<ReplicaCollective> request;
  };
  std::deque<Gathering> gathering;
  auto finish = [&](Gathering& g) {
    g.request->wait();
    const ShardLayout::Bucket& b = *g.bucket;
    // This replica's chunk is its masters (the pieces view the parameters): written around.
    const int64_t own = b.begin + layout_.replica * b.chunk;
    for (size_t p = b.first_param; p < b.end_param; ++p) {
      const int64_t begin = layout_.param_offset[p], end = begin + params_[p].numel();
      const at::Tensor flat = params_[p].detach().view({-1});
      for (const auto& [from, to] :
           {std::pair{begin, std::min(end, own)}, std::pair{std::max(begin, own + b.chunk), end}})
        if (from < to) flat.narrow(0, from - begin, to - from).copy_(g.buffer.narrow(0, from - b.begin, to - from));
    }
  };
  size_t k = 0;  // the next piece, in flat order
  for (const ShardLayout::Bucket& b : layout_.buckets) {
    at::Tensor buffer = at::empty({b.chunk * layout_.replicas},  // (where the collective reads it)
                                  at::TensorOptions(type).device(collectives_->on_device() ? device_ : at::kCPU));
    at::Tensor mine = buffer.narrow(0, layout_.replica * b.chunk, b.chunk).zero_();
    for (; k < pieces_.size() && layout_.pieces[k].shard_offset < b.shard_offset + b.chunk; ++k)
      mine.narrow(0, layout_.pieces[k].shard_offset - b.shard_offset, layout_.pieces[k].numel)
          .copy_(pieces_[k].reshape({-1}));
    gathering.push_back({&b, buffer, collectives_->all_gather(buffer)});
    gathered_bytes_ += buffer.nbytes();
    if (gathering.size() >= kInFlight) finish(gathering.front()), gathering.pop_front();
  }
  for (Gathering& g : gathering) finish(g);
}

}  // namespace dawnpiper
