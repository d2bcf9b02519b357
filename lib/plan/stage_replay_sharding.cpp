// What data parallelism adds to a stage's memory, and the update (plan/stage_replay.h).
#include "plan/stage_replay.h"

namespace dawnpiper {
namespace detail {

// As the runtime's shard_layout cuts a stage's parameters: whole nodes' parameters, a bucket
// closed once it reaches the bucket size; a bucket holding a weight tied across stages (a copy,
// or an owner another stage copies) is marked, its gradient summed over the stages first.
StageReplay::BucketCut StageReplay::cut_buckets(const std::vector<int64_t>& param_bytes) const {
  std::vector<char> tied_across(param_bytes.size(), 0);
  for (int n = 0; n < static_cast<int>(p_.nodes.size()); ++n) {
    const int owner = p_.nodes[at(n)].tied_owner;
    if (owner < 0 || in_range(owner) == in_range(n)) continue;
    if (in_range(n)) tied_across[at(n - b_)] = 1;
    if (in_range(owner)) tied_across[at(owner - b_)] = 1;
  }
  BucketCut cut;
  cut.bucket_of.assign(param_bytes.size(), -1);
  int64_t open = 0;
  bool tied = false;
  auto close = [&] {
    if (open > 0) cut.bytes.push_back(open), cut.tied.push_back(tied);
    open = 0;
    tied = false;
  };
  for (size_t j = 0; j < param_bytes.size(); ++j) {
    if (param_bytes[j] == 0) continue;
    cut.bucket_of[j] = static_cast<int>(cut.bytes.size());
    tied = tied || tied_across[j];
    if ((open += param_bytes[j]) >= model_.bucket_bytes()) close();
  }
  close();
  return cut;
}

void StageReplay::place_zero_buckets(const std::vector<int64_t>& param_bytes) {
  zero_buckets_.clear();
  zero_bucket_grads_.clear();
  zero_deferred_.clear();
  zero_order_.clear();
  zero_bucket_of_.clear();
  zero_shard_ = 0;
  if (model_.zero_stage() == 0) return;
  // Level 2: the buckets of weights tied across stages wait for the update, after the stages' sum.
  BucketCut cut = cut_buckets(param_bytes);
  zero_bucket_of_ = std::move(cut.bucket_of);
  zero_bucket_grads_ = std::move(cut.bytes);
  zero_deferred_ = std::move(cut.tied);
  const int64_t d = model_.data_parallel(), unit = 4 * d;  // each replica's chunk: whole fp32 elements
  for (int64_t bytes : zero_bucket_grads_)
    zero_buckets_.push_back((bytes + unit - 1) / unit * unit), zero_shard_ += zero_buckets_.back() / d;
  for (size_t k = zero_buckets_.size(); k-- > 0;)
    if (!zero_deferred_[k]) zero_order_.push_back(k);
  zero_made_.assign(param_bytes.size(), 0);
  zero_chunk_held_.assign(zero_buckets_.size(), 0);
  zero_waiting_.assign(zero_buckets_.size(), 0);
  zero_end_micro_batch();  // (sets the counts)
}

void StageReplay::place_average_buckets(const std::vector<int64_t>& param_bytes) {
  avg_buckets_.clear();
  avg_deferred_.clear();
  avg_order_.clear();
  avg_bucket_of_.assign(param_bytes.size(), -1);
  weight_passes_per_step_ = 0;
  // The step's last weight pass: level 0's packs its buckets, level 1's streams them.
  if ((averages_buckets() || model_.zero_stage() == 1) && model_.schedule().traits().updates_once_per_step && !stream_)
    for (const Action& a : actions_)
      weight_passes_per_step_ += a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardWeight;
  if (!averages_buckets()) return;
  // A bucket holding a weight tied across stages waits for the pass's end.
  BucketCut cut = cut_buckets(param_bytes);
  avg_bucket_of_ = std::move(cut.bucket_of);
  avg_buckets_ = std::move(cut.bytes);
  avg_deferred_ = std::move(cut.tied);
  for (size_t k = avg_buckets_.size(); k-- > 0;)
    if (!avg_deferred_[k]) avg_order_.push_back(k);
  for (size_t k = 0; k < avg_buckets_.size(); ++k)
    if (avg_deferred_[k]) avg_order_.push_back(k);
  avg_packed_.assign(avg_buckets_.size(), 0);
  avg_waiting_.assign(avg_buckets_.size(), 0);
}

bool StageReplay::begin_weight_pass() {
  avg_armed_ = zero_armed_ = false;
  if (weight_passes_per_step_ == 0 || ++weight_passes_ != weight_passes_per_step_) return false;
  if (model_.zero_stage() == 1) return zero_armed_ = true;
  if (avg_buckets_.empty()) return false;
  avg_armed_ = true;
  avg_next_ = 0;
  std::fill(avg_waiting_.begin(), avg_waiting_.end(), 0);
  for (int k : avg_bucket_of_)
    if (k >= 0) ++avg_waiting_[at(k)];
  for (size_t k = 0; k < avg_buckets_.size(); ++k)
    if (avg_deferred_[k]) avg_waiting_[k] = 1;  // (never 0: packed at the pass's end)
  return true;
}

void StageReplay::average_gradient_made(int i) {
  if (!avg_armed_) return;
  const int k = avg_bucket_of_[at(i - b_)];
  if (k < 0 || avg_deferred_[at(k)]) return;
  --avg_waiting_[at(k)];
  while (avg_next_ < avg_order_.size() && avg_waiting_[avg_order_[avg_next_]] == 0)
    average_pack(avg_order_[avg_next_++]);
}

// The runtime's MpiAverager::start_bucket: the buffer beside the gradients it copies, which then
// go (the same bytes).
void StageReplay::average_pack(size_t k) {
  note(live_ + avg_buckets_[k], -1);
  avg_packed_[k] = 1;
}

void StageReplay::average_pass_end() {
  if (!avg_armed_ || avg_next_ > avg_order_.size()) return;
  for (size_t k : avg_order_)
    if (!avg_packed_[k]) average_pack(k);
  avg_armed_ = false;
  avg_next_ = avg_order_.size() + 1;  // (done)
}

void StageReplay::zero_gradient_made(int i) {
  const int k = zero_bucket_of_[at(i - b_)];
  if (k < 0 || zero_deferred_[at(k)] || zero_made_[at(i - b_)]) return;
  zero_made_[at(i - b_)] = 1;
  --zero_waiting_[at(k)];
  while (zero_next_ < zero_order_.size() && zero_waiting_[zero_order_[zero_next_]] == 0)
    zero_start(zero_order_[zero_next_++]);
}

// The runtime's ZeroShard::start: the bucket's chunk of the shard (zeros) at its first start in
// the step, its buffer beside its gradients, which it then releases; two buckets travel at most.
void StageReplay::zero_start(size_t k) {
  if (!zero_chunk_held_[k]) live_ += zero_buckets_[k] / model_.data_parallel(), zero_chunk_held_[k] = 1;
  note(live_ + zero_buckets_[k], -1);
  live_ += zero_buckets_[k] - zero_bucket_grads_[k];
  param_grads_ -= zero_bucket_grads_[k];
  zero_travelling_.push_back(zero_buckets_[k]);
  if (zero_travelling_.size() >= 2) live_ -= zero_travelling_.front(), zero_travelling_.pop_front();
}

// After a weight pass that streamed (ZeroShard::end_micro_batch): what has not started starts,
// and everything completes (level 1: at the update).
void StageReplay::zero_end_micro_batch() {
  if (zero_streaming()) {
    while (zero_next_ < zero_order_.size()) zero_start(zero_order_[zero_next_++]);
    if (zero_streams())
      while (!zero_travelling_.empty()) live_ -= zero_travelling_.front(), zero_travelling_.pop_front();
  }
  zero_armed_ = false;
  zero_next_ = 0;
  std::fill(zero_made_.begin(), zero_made_.end(), 0);
  std::fill(zero_waiting_.begin(), zero_waiting_.end(), 0);
  for (int k : zero_bucket_of_)
    if (k >= 0) ++zero_waiting_[at(k)];
}

void StageReplay::gather_read(int i) { gather_buckets(gather_reads_[at(i - b_)], i); }

void StageReplay::gather_buckets(const std::vector<int>& buckets, int node) {
  for (int k : buckets) {
    if (gathered_[at(k)]) continue;
    live_ += zero_buckets_[at(k)];
    note(live_, node);
    gathered_[at(k)] = 1;
  }
}

void StageReplay::gather_forward(int i) {
  gather_read(i);
  if (param_reads_[at(i - b_)].empty()) return;
  if (const int ahead = next_param_reader_[at(i - b_)]; ahead >= 0) gather_buckets(param_reads_[at(ahead - b_)], i);
}

void StageReplay::gather_backward(int i, bool input_only) {
  gather_read(i);
  if (gather_reads_[at(i - b_)].empty()) return;
  if (input_only && input_pass_node_[at(i - b_)] == 0) {
    input_pass_node_[at(i - b_)] = 1;
    for (int k : gather_reads_[at(i - b_)]) ++input_pass_readers_[at(k)];
  }
  ahead_reader_ = previous_param_reader_[at(i - b_)];
  if (ahead_reader_ >= 0) gather_buckets(param_reads_[at(ahead_reader_ - b_)], i);
}

void StageReplay::input_pass_begins() {
  input_pass_node_.assign(gather_reads_.size(), 0);
  input_pass_readers_.assign(zero_buckets_.size(), 0);
  ahead_reader_ = -1;
}

void StageReplay::readers_ran(int i) {
  for (int n : readers_of_output_[at(i - b_)]) {
    if (input_pass_node_[at(n - b_)] != 1) continue;
    input_pass_node_[at(n - b_)] = 2;
    const bool ahead_waits = ahead_reader_ >= 0 && input_pass_node_[at(ahead_reader_ - b_)] == 0;
    for (int k : gather_reads_[at(n - b_)]) {
      if (--input_pass_readers_[at(k)] > 0 || !gathered_[at(k)]) continue;
      if (ahead_waits && std::binary_search(param_reads_[at(ahead_reader_ - b_)].begin(),
                                            param_reads_[at(ahead_reader_ - b_)].end(), k))
        continue;
      live_ -= zero_buckets_[at(k)];
      gathered_[at(k)] = 0;
    }
  }
}

void StageReplay::after_forward_node(int i) {
  if (gather_reads_[at(i - b_)].empty()) return;
  const int next = next_reader_[at(i - b_)], ahead = next_param_reader_[at(i - b_)];
  auto kept = [&](int reader, const std::vector<std::vector<int>>& reads, size_t k) {
    if (reader < 0) return false;
    const std::vector<int>& keep = reads[at(reader - b_)];
    return std::binary_search(keep.begin(), keep.end(), static_cast<int>(k));
  };
  for (size_t k = 0; k < gathered_.size(); ++k) {
    if (!gathered_[k] || kept(next, gather_reads_, k) || kept(ahead, param_reads_, k) || i >= sent_view_from_[k])
      continue;
    live_ -= zero_buckets_[k];
    gathered_[k] = 0;
  }
}

void StageReplay::sent_views_copied() {
  for (size_t k = 0; k < gathered_.size(); ++k)
    if (gathered_[k] && sent_view_from_[k] != std::numeric_limits<int>::max())
      live_ -= zero_buckets_[k], gathered_[k] = 0;
}

void StageReplay::gather_released(int i) {
  const int k = zero_bucket_of_[at(i - b_)];
  if (k < 0 || --gather_unmade_[at(k)] != 0 || !gathered_[at(k)]) return;
  live_ -= zero_buckets_[at(k)];
  gathered_[at(k)] = 0;
}

void StageReplay::release_gathered() {
  for (size_t k = 0; k < gathered_.size(); ++k)
    if (gathered_[k]) live_ -= zero_buckets_[k], gathered_[k] = 0;
  std::fill(gather_unmade_.begin(), gather_unmade_.end(), 0);
  for (int k : zero_bucket_of_)
    if (k >= 0) ++gather_unmade_[at(k)];
}

void StageReplay::optimizer_step() {
  if (segment_ >= 0) segment_ = 2;
  for (size_t k : avg_order_)  // the averaging packs what no pass packed, then waits
    if (!avg_packed_[k]) average_pack(k);
  std::fill(avg_packed_.begin(), avg_packed_.end(), 0);
  weight_passes_ = 0;
  avg_armed_ = false;
  const bool zero = model_.zero_stage() > 0;
  if (zero) {
    // The gradients reduce-scattered into the shard a bucket at a time: bucket k's buffer with
    // k - 1's still travelling, whose gradients (about its size) are released by then.
    // From the second step on the optimizer state is there already (this pass is walked once).
    // Only the buckets that did not stream (the deferred ones; level 1's where the step has no
    // last weight pass); the shard is there already where a bucket streamed.
    int64_t largest = 0, shard = zero_shard_;
    for (size_t k = 0; k < zero_buckets_.size(); ++k)
      if (zero_chunk_held_[k] || (zero_streams() && !zero_deferred_[k]))  // (a repeated walk sets no flag)
        shard -= zero_buckets_[k] / model_.data_parallel();
      else
        largest = std::max(largest, zero_buckets_[k]);
    // Level 1: the bucket the last weight pass left travelling completes as the first one here
    // starts (two in flight), or before the optimizer's state is allocated.
    int64_t travelling = 0;
    for (int64_t bytes : zero_travelling_) travelling += bytes;
    zero_travelling_.clear();
    note(live_ + travelling + shard + largest + (optimizer_state_ ? 0 : optimizer_state_bytes()), -1);
    live_ -= travelling;
    live_ += shard - param_grads_;
    param_grads_ = 0;
    std::fill(zero_chunk_held_.begin(), zero_chunk_held_.end(), 0);
  }
  const int64_t state_bytes = optimizer_state_bytes();
  if (!optimizer_state_) live_ += state_bytes, optimizer_state_ = true;
  if (optimizer_has_moments(model_.optimizer()))
    note(live_ + std::min(p_.largest_param_bytes, zero ? zero_shard_ : weights_), -1);
  note(live_, -1);
  live_ -= param_grads_;
  param_grads_ = 0;
  if (zero) {
    // The shard's gradients go; the parameters are all-gathered a bucket at a time in the
    // compute precision (bf16: half the bytes), each bucket's buffer with the previous bucket's
    // still travelling (level 3: where they are read, into the bucket's own storage).
    live_ -= zero_shard_;
    const int64_t halves = p_.precision == Precision::Bf16 ? 2 : 1;
    for (size_t k = 0; k < (zero_gathers() ? 0 : zero_buckets_.size()); ++k)
      note(live_ + (zero_buckets_[k] + (k > 0 ? zero_buckets_[k - 1] : 0)) / halves, -1);
  }
  std::fill(grad_done_.begin(), grad_done_.end(), 0);
  backward_in_step_ = false;
  ++version_;
}

}  // namespace detail
}  // namespace dawnpiper
