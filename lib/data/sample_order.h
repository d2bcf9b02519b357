#pragma once
// Which of a data file's samples a split holds, and in which order a run reads them: the last
// `validation_fraction` of the samples (at least one if the fraction is positive) are held out;
// sample i of a run is sample i of the split (sequential) or sample perm_e(i mod count) of a
// permutation drawn per epoch e from the seed (shuffled). Token files (windows) and sample files
// (arrays' rows) share it, so both read in the same order.
#include <cstdint>
#include <vector>

namespace dawnpiper {

enum class DataSplit { Train, Validation };

class SampleOrder {
 public:
  SampleOrder(int64_t total, double validation_fraction, DataSplit split, bool sequential, uint64_t seed);
  int64_t count() const { return count_; }
  // The file's sample that sample `sample` of the run reads (count() must be positive).
  int64_t at(int64_t sample) const;

 private:
  uint64_t seed_;
  bool sequential_;
  int64_t first_ = 0, count_ = 0;             // samples [first_, first_ + count_)
  mutable std::vector<int64_t> permutation_;  // of the current epoch (shuffled order)
  mutable int64_t epoch_ = -1;
};

}  // namespace dawnpiper
