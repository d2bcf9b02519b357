#pragma once
// Samples given whole, for inputs that are not tokens (audio features, images, ...): a
// safetensors file holding one array per model input, named as the input (the model file's
// `inputs`, `dawnpiper graph --model-file F --summary` lists them), samples along dim 0 and each
// sample shaped as the input without its batch dimension. Floating-point arrays fill
// floating-point inputs, integer arrays integer ones (converted to the input's dtype). Every
// array has the same number of samples N; the split and the order are the token file's
// (data/sample_order.h: the last --validation-fraction of the N held out; --data-order).
// Inputs whose role is `zeros` need no array; arrays no input reads are ignored.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/sample_order.h"
#include "data/synthetic.h"
#include "util/safetensors.h"

namespace dawnpiper {

struct DataConfig;

// Whether --data names a sample file (by its extension) rather than a token file.
bool is_sample_file(const std::string& path);

class SampleFileData final : public DataSource {
 public:
  // Checks every input against its array (present, shape, kind of dtype, token ids below the
  // input's vocabulary) and that the split holds `needed` samples; ConfigError otherwise.
  SampleFileData(const OpGraph& graph, std::shared_ptr<const SafetensorsFile> file, const DataConfig& config,
                 uint64_t seed, DataSplit split, int64_t needed);
  void load(TensorEnv& env, const std::vector<int>& wanted, int64_t first_sample, at::Device device) const override;
  int64_t samples() const { return order_.count(); }

 private:
  std::shared_ptr<const SafetensorsFile> file_;
  SampleOrder order_;
};

// The number of samples every array of the file holds; ConfigError if the file has no arrays
// or they disagree.
int64_t sample_count(const SafetensorsFile& file);

}  // namespace dawnpiper
