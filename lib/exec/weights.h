#pragma once
// Loading an imported model's weights: each parameter or buffer by its PyTorch name (or a name
// a tied copy goes by) from the graph's weight files, first file first (--init-from before the
// model file). Only the tensors asked for are read, so each rank loads only its own stage. A
// mixture of experts saved by transformers (each expert's weights apart, Mixtral's and Qwen-MoE's
// checkpoint names) is read into the module's fused experts.gate_up_proj and experts.down_proj.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "graph/op_graph.h"
#include "util/safetensors.h"

namespace dawnpiper {

class WeightLoader {
 public:
  explicit WeightLoader(const std::vector<std::string>& files);
  size_t files() const { return files_.size(); }
  // A fresh CPU tensor of `shape` and `dtype` (converted from the file's dtype if it differs).
  // Throws ConfigError naming the weight when no file (or, with first_only, not the first
  // file: a checkpoint must hold every parameter) has it or its shape differs.
  at::Tensor load(const std::string& name, const std::vector<std::string>& aliases, const Shape& shape, DType dtype,
                  bool first_only = false);

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
};

// With --init-from (two weight files): the first must hold every parameter the graph reads from
// files, under its name or a tied one, in its shape. Reads the file's header alone, so the run can
// refuse a checkpoint of another model before any work (ConfigError naming the first mismatch and
// how many more there are). One weight file: nothing to check.
void check_init_weights(const OpGraph& graph);

}  // namespace dawnpiper
