#pragma once
// Imported models: a DawnPiper model file (docs/model-format.md; written by
// scripts/export_model.py from torch.export) turned into an OpGraph of Aten nodes for any
// micro-batch size. Pure C++: the graph JSON lives in the safetensors file's metadata; the
// weights stay in the file until a stage loads its own (exec/stage_module.h).
#include <cstdint>
#include <memory>
#include <string>

#include "graph/op_graph.h"
#include "util/json.h"

namespace dawnpiper {

struct ModelFile {
  static constexpr int kFormatVersion = 1;
  std::string path;
  std::string name;          // the file's base name: the graph's preset (profile/plan identity)
  std::string architecture;  // "gpt2", "llama", ... or the user's function
  int64_t min_batch = 1, max_batch = 1;
  Precision precision = Precision::Fp32;  // "bf16": exported under torch.autocast
  Json graph;                             // the metadata's graph, parsed once
};

// Reads and checks a model file's header; throws ConfigError naming the file and the problem
// (not a model file, another format version, a malformed graph).
std::shared_ptr<const ModelFile> read_model_file(const std::string& path);

// The model's OpGraph at one micro-batch size (validated). Weight files: `init_from` (a
// safetensors checkpoint with PyTorch names, e.g. a Hugging Face model.safetensors) first, if
// given, then the model file itself. Throws ConfigError for a batch size outside the file's range.
OpGraph build_imported(const ModelFile& file, int64_t micro_batch_size, const std::string& init_from = "");

}  // namespace dawnpiper
