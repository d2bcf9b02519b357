#pragma once
// Real data: a flat token file (uint16 or uint32 little-endian ids, nanoGPT/Megatron style) with
// its metadata next to it (<file>.json: dtype, token count, vocabulary size; written by
// scripts/prepare_data.py). The file is memory-mapped; samples are non-overlapping windows of
// S + 1 tokens (S = the graph's sequence length), the last `validation_fraction` of them held out.
// Sample i of a run is window i (--data-order sequential) or window perm_e(i mod W) of a
// permutation drawn per epoch e from the seed (shuffled): reproducible from the seed either way.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/sample_order.h"
#include "data/synthetic.h"
#include "util/enum_names.h"

namespace dawnpiper {

// --data-order: windows in a seeded order per epoch, or sample i of the run is window i.
enum class DataOrder { Shuffled, Sequential };
template <>
struct EnumNames<DataOrder> {
  static constexpr const char* what = "data order";
  static constexpr std::array<std::pair<DataOrder, const char*>, 2> table{
      {{DataOrder::Shuffled, "shuffled"}, {DataOrder::Sequential, "sequential"}}};
  static constexpr std::array<const char*, 2> meaning{"windows in a seeded order per epoch",
                                                      "sample i of the run is window i"};
};

// Where a run's samples come from.
struct DataConfig {
  std::string path;         // token file, or a sample file (*.safetensors, data/sample_file.h); empty: synthetic data
  bool sequential = false;  // DataOrder::Sequential: sample i is window i
  double validation_fraction = 0.0;
};

class TokenFile {
 public:
  // Maps the file and reads its metadata; throws ConfigError naming the file and the problem
  // (missing, no metadata, a size that does not match the metadata).
  explicit TokenFile(const std::string& path);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  int64_t size() const { return tokens_; }
  int64_t vocab_size() const { return vocab_; }
  int64_t at(int64_t i) const {
    return wide_ ? reinterpret_cast<const uint32_t*>(base_)[i] : reinterpret_cast<const uint16_t*>(base_)[i];
  }
  const std::string& path() const { return path_; }
  // Throws ConfigError naming the first token >= vocab and its offset.
  void check_ids_below(int64_t vocab, const std::string& model) const;

 private:
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  int64_t tokens_ = 0, vocab_ = 0;
  bool wide_ = false;  // uint32 ids
};

class TokenFileData final : public DataSource {
 public:
  // Every Input node must have a token role. `needed`: samples one step consumes (micro-batch
  // size x count); a split with fewer windows is a ConfigError.
  TokenFileData(const OpGraph& graph, std::shared_ptr<const TokenFile> file, const DataConfig& config, uint64_t seed,
                DataSplit split, int64_t needed);
  void load(TensorEnv& env, const std::vector<int>& wanted, int64_t first_sample, at::Device device) const override;
  int64_t windows() const { return order_.count(); }

 private:
  std::shared_ptr<const TokenFile> file_;
  uint64_t seed_;
  int64_t seq_len_ = 0;
  SampleOrder order_;  // of the split's windows
};

// The data source a run's stages read: synthetic samples (validation ones from another seed
// stream), the token file's split, or a sample file's (a path ending in .safetensors).
std::unique_ptr<DataSource> make_data_source(const OpGraph& graph, const DataConfig& config, uint64_t seed,
                                             DataSplit split, int64_t needed);
// Opens --data's file (token file and metadata, or sample file) to refuse a bad one before any work.
void check_data_file(const std::string& path);

}  // namespace dawnpiper
