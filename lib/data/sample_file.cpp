#include "data/sample_file.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstring>

#include "data/scalar_type.h"
#include "data/token_file.h"
#include "util/error.h"

namespace dawnpiper {

bool is_sample_file(const std::string& path) {
  const std::string ext = ".safetensors";
  return path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
}

int64_t sample_count(const SafetensorsFile& file) {
  int64_t n = -1;
  std::string first;
  for (const std::string& name : file.names()) {
    const SafetensorsEntry& e = file.entry(name);
    if (e.shape.empty())
      throw ConfigError("sample file '" + file.path() + "': array " + name +
                        " is a scalar; arrays hold one sample per row (dim 0)");
    if (n >= 0 && e.shape[0] != n)
      throw ConfigError("sample file '" + file.path() + "': array " + name + " has " + std::to_string(e.shape[0]) +
                        " samples, " + first + " " + std::to_string(n) + " (every array holds one row per sample)");
    if (n < 0) n = e.shape[0], first = name;
  }
  if (n < 0) throw ConfigError("sample file '" + file.path() + "' holds no arrays");
  return n;
}

namespace {
std::string shape_text(const std::vector<int64_t>& shape, size_t from) {
  std::string s = "[";
  for (size_t i = from; i < shape.size(); ++i) s += (i > from ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Arrays with a token role must hold ids of the input's vocabulary (or -100, ignored labels).
void check_ids(const SafetensorsFile& file, const SafetensorsEntry& e, const Node& input, const std::string& model) {
  const int64_t vocab = input.attr_int("vocab", 0);
  if (vocab <= 0 || !is_token_role(input.role)) return;
  int64_t count = 1;
  for (int64_t d : e.shape) count *= d;
  at::Tensor ids =
      at::from_blob(const_cast<void*>(file.data(e)), {count}, at::TensorOptions(scalar_type(e.dtype))).to(at::kLong);
  at::Tensor bad = ((ids >= vocab) | ((ids < 0) & (ids != -100))).nonzero();
  if (bad.numel() == 0) return;
  const int64_t at_index = bad[0].item<int64_t>();
  throw ConfigError("sample file '" + file.path() + "': array " + e.name + " holds id " +
                    std::to_string(ids[at_index].item<int64_t>()) + " at element " + std::to_string(at_index) +
                    ", outside " + model + "'s vocabulary of " + std::to_string(vocab));
}
}  // namespace

SampleFileData::SampleFileData(const OpGraph& graph, std::shared_ptr<const SafetensorsFile> file,
                               const DataConfig& config, uint64_t seed, DataSplit split, int64_t needed)
    : DataSource(graph),
      file_(std::move(file)),
      order_(sample_count(*file_), config.validation_fraction, split, config.sequential, seed) {
  const std::string& path = file_->path();
  for (const Node& n : graph.nodes) {
    if (n.kind != OpKind::Input || n.role == "zeros") continue;
    const TensorInfo& info = graph.tensor(n.outputs[0]);
    if (!file_->contains(n.name)) {
      std::string names;
      for (const std::string& a : file_->names()) names += (names.empty() ? "" : ", ") + a;
      throw ConfigError("sample file '" + path + "' has no array " + n.name + " (input " + n.name + " of " +
                        graph.preset + ", each sample " + dtype_name(info.dtype) + " " + shape_text(info.shape, 1) +
                        "; the file holds " + names + ")");
    }
    const SafetensorsEntry& e = file_->entry(n.name);
    const std::vector<int64_t> want(info.shape.begin(), info.shape.end());
    if (e.shape.size() != want.size() || !std::equal(e.shape.begin() + 1, e.shape.end(), want.begin() + 1))
      throw ConfigError("sample file '" + path + "': array " + n.name + " has samples of shape " +
                        shape_text(e.shape, 1) + "; input " + n.name + " of " + graph.preset + " takes " +
                        shape_text(want, 1) + " (the array: [samples" + (want.size() > 1 ? ", " : "") +
                        shape_text(want, 1).substr(1) + ")");
    if (is_floating(e.dtype) != is_floating(info.dtype))
      throw ConfigError("sample file '" + path + "': array " + n.name + " is " + dtype_name(e.dtype) + "; input " +
                        n.name + " of " + graph.preset + " is " + dtype_name(info.dtype) + " (give " +
                        (is_floating(info.dtype) ? "floating-point" : "integer") + " values)");
    if (!is_floating(e.dtype)) check_ids(*file_, e, n, graph.preset);
  }
  const char* what = split == DataSplit::Train ? "training" : "validation";
  if (order_.count() < needed)
    throw ConfigError("sample file '" + path + "' is too short: " + std::to_string(sample_count(*file_)) +
                      " samples give " + std::to_string(order_.count()) + " " + what + " samples, one step needs " +
                      std::to_string(needed));
}

void SampleFileData::load(TensorEnv& env, const std::vector<int>& wanted, int64_t first_sample,
                          at::Device device) const {
  at::NoGradGuard no_grad;
  for (int t : wanted) {
    const TensorInfo& info = graph_->tensor(t);
    const Node& input = graph_->nodes[info.producer];
    if (input.role == "zeros") {
      env.at(t) = at::zeros(info.shape, at::TensorOptions(scalar_type(info.dtype)).device(device));
      continue;
    }
    const SafetensorsEntry& e = file_->entry(input.name);
    const std::vector<int64_t> shape(info.shape.begin(), info.shape.end());
    const int64_t rows = shape.at(0);
    int64_t row_bytes = dtype_size(e.dtype);
    for (size_t d = 1; d < shape.size(); ++d) row_bytes *= shape[d];
    // Rows copied out of the mapped file (no alignment assumed), then one conversion.
    at::Tensor batch = at::empty(shape, at::TensorOptions(scalar_type(e.dtype)));
    auto* out = static_cast<uint8_t*>(batch.data_ptr());
    const auto* base = static_cast<const uint8_t*>(file_->data(e));
    for (int64_t b = 0; b < rows; ++b)
      std::memcpy(out + b * row_bytes, base + order_.at(first_sample + b) * row_bytes, static_cast<size_t>(row_bytes));
    env.at(t) = batch.to(device, scalar_type(info.dtype));
  }
}

}  // namespace dawnpiper
