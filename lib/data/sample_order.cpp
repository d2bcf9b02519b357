#include "data/sample_order.h"

#include <algorithm>
#include <cmath>

#include "util/seed.h"

namespace dawnpiper {

SampleOrder::SampleOrder(int64_t total, double validation_fraction, DataSplit split, bool sequential, uint64_t seed)
    : seed_(seed), sequential_(sequential) {
  const int64_t held_out =
      validation_fraction > 0
          ? std::max<int64_t>(1, static_cast<int64_t>(std::ceil(validation_fraction * static_cast<double>(total))))
          : 0;
  first_ = split == DataSplit::Train ? 0 : total - held_out;
  count_ = split == DataSplit::Train ? total - held_out : held_out;
}

int64_t SampleOrder::at(int64_t sample) const {
  const int64_t epoch = sample / count_, j = sample % count_;
  if (sequential_) return first_ + j;
  if (epoch != epoch_) {  // Fisher-Yates from (seed, epoch)
    permutation_.resize(static_cast<size_t>(count_));
    for (int64_t i = 0; i < count_; ++i) permutation_[static_cast<size_t>(i)] = i;
    uint64_t state = mix_seed(seed_ ^ 0x0e90c4ULL, static_cast<uint64_t>(epoch));
    for (int64_t i = count_ - 1; i > 0; --i) {
      state = mix_seed(state, static_cast<uint64_t>(i));
      std::swap(permutation_[static_cast<size_t>(i)],
                permutation_[static_cast<size_t>(state % static_cast<uint64_t>(i + 1))]);
    }
    epoch_ = epoch;
  }
  return first_ + permutation_[static_cast<size_t>(j)];
}

}  // namespace dawnpiper
