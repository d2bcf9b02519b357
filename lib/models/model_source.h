#pragma once
// The model a command works on: a zoo preset (with overrides) or an imported model file
// (models/model_file.h), built as an OpGraph for any micro-batch size. Pure C++.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "graph/op_graph.h"
#include "models/model_config.h"
#include "models/model_file.h"

namespace dawnpiper {

class ModelSource {
 public:
  ModelSource(const ModelConfig& config) : config_(config) {}  // NOLINT: a preset is a source
  static ModelSource preset(const ModelConfig& config, Precision precision = Precision::Fp32);
  // Reads the file's header now (errors surface before any work); `init_from` is a safetensors
  // checkpoint whose weights replace the file's (by PyTorch name). The file fixes its precision
  // (scripts/export_model.py --precision); asking for another is a ConfigError.
  static ModelSource file(const std::string& path, const std::string& init_from = "",
                          std::optional<Precision> precision = std::nullopt);

  OpGraph graph(int64_t micro_batch_size) const;
  std::string name() const;  // the preset, or the model file's base name
  bool imported() const { return file_ != nullptr; }
  const ModelConfig& config() const { return *config_; }  // presets only
  const ModelFile& model_file() const { return *file_; }  // imported only

 private:
  ModelSource() = default;
  std::optional<ModelConfig> config_;
  std::shared_ptr<const ModelFile> file_;
  std::string init_from_;
  Precision precision_ = Precision::Fp32;
};

}  // namespace dawnpiper
