#include "exec/weights.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <optional>

#include "data/scalar_type.h"
#include "util/error.h"

namespace dawnpiper {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Where a file written by transformers' save_pretrained keeps a weight the model names otherwise.
// transformers keeps a mixture of experts' weights fused in the module (experts.gate_up_proj
// [E, 2I, H], each expert's gate rows then its up rows; experts.down_proj [E, H, I]) and saves
// them one expert at a time under the original checkpoints' names (Mixtral: w1 gate, w3 up, w2
// down, under block_sparse_moe; Qwen-MoE: gate_proj, up_proj, down_proj). `parts[e]` are expert
// e's tensors, stacked along dim 0; one part of one "expert": a plain rename.
struct SavedAs {
  std::vector<std::vector<std::string>> parts;
  bool stacked = false;  // experts: parts stacked into a new leading dimension
};

std::optional<SavedAs> saved_as(const SafetensorsFile& file, const std::string& name) {
  std::vector<std::string> prefixes{name};
  if (const size_t at = name.find(".mlp."); at != std::string::npos)
    prefixes.push_back(name.substr(0, at) + ".block_sparse_moe." + name.substr(at + 5));
  for (size_t i = 1; i < prefixes.size(); ++i)
    if (file.contains(prefixes[i])) return SavedAs{{{prefixes[i]}}, false};
  static const std::vector<std::pair<std::string, std::vector<std::vector<std::string>>>> fused{
      {"experts.gate_up_proj", {{"w1", "w3"}, {"gate_proj", "up_proj"}}},
      {"experts.down_proj", {{"w2"}, {"down_proj"}}}};
  for (const auto& [tail, layouts] : fused) {
    if (!ends_with(name, tail)) continue;
    for (const std::string& prefix : prefixes) {
      const std::string base = prefix.substr(0, prefix.size() - tail.size()) + "experts.";
      for (const std::vector<std::string>& layout : layouts) {
        SavedAs saved{{}, true};
        for (int e = 0;; ++e) {
          std::vector<std::string> expert;
          for (const std::string& part : layout) expert.push_back(base + std::to_string(e) + "." + part + ".weight");
          if (!std::all_of(expert.begin(), expert.end(), [&](const std::string& n) { return file.contains(n); })) break;
          saved.parts.push_back(std::move(expert));
        }
        if (!saved.parts.empty()) return saved;
      }
    }
  }
  return std::nullopt;
}

// The shape the saved parts assemble into (each expert's parts concatenated along dim 0).
Shape assembled_shape(const SafetensorsFile& file, const SavedAs& saved) {
  Shape expert = file.entry(saved.parts.front().front()).shape;
  for (size_t k = 1; k < saved.parts.front().size(); ++k) expert[0] += file.entry(saved.parts.front()[k]).shape[0];
  if (!saved.stacked) return expert;
  expert.insert(expert.begin(), static_cast<int64_t>(saved.parts.size()));
  return expert;
}

at::Tensor read_entry(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsEntry& e = file.entry(name);
  return at::from_blob(const_cast<void*>(file.data(e)), e.shape, at::TensorOptions(scalar_type(e.dtype)));
}

}  // namespace

WeightLoader::WeightLoader(const std::vector<std::string>& files) {
  for (const std::string& f : files) files_.push_back(std::make_unique<SafetensorsFile>(f));
}

at::Tensor WeightLoader::load(const std::string& name, const std::vector<std::string>& aliases, const Shape& shape,
                              DType dtype, bool first_only) {
  at::NoGradGuard no_grad;
  std::vector<std::string> names{name};
  names.insert(names.end(), aliases.begin(), aliases.end());
  const size_t searched = first_only ? std::min<size_t>(1, files_.size()) : files_.size();
  for (size_t f = 0; f < searched; ++f)
    for (const std::string& n : names) {
      const auto& file = files_[f];
      if (!file->contains(n)) continue;
      const SafetensorsEntry& e = file->entry(n);
      if (e.shape != shape)
        throw ConfigError("weight " + name + " in '" + file->path() + "' has shape " + shape_str(e.shape) +
                          ", but the model needs " + shape_str(shape));
      return read_entry(*file, n).to(scalar_type(dtype), /*non_blocking=*/false, /*copy=*/true);
    }
  for (size_t f = 0; f < searched; ++f) {
    const SafetensorsFile& file = *files_[f];
    const std::optional<SavedAs> saved = saved_as(file, name);
    if (!saved) continue;
    if (const Shape found = assembled_shape(file, *saved); found != shape)
      throw ConfigError("weight " + name + " in '" + file.path() + "' (as " + saved->parts.front().front() +
                        (saved->stacked ? " and the other experts'" : "") + ") has shape " + shape_str(found) +
                        ", but the model needs " + shape_str(shape));
    std::vector<at::Tensor> experts;
    for (const std::vector<std::string>& parts : saved->parts) {
      std::vector<at::Tensor> pieces;
      for (const std::string& part : parts) pieces.push_back(read_entry(file, part));
      experts.push_back(at::cat(pieces, 0));
    }
    const at::Tensor whole = saved->stacked ? at::stack(experts, 0) : experts.front();
    return whole.to(scalar_type(dtype), /*non_blocking=*/false, /*copy=*/true);
  }
  std::string where;
  for (size_t f = 0; f < searched; ++f) where += (where.empty() ? "'" : ", '") + files_[f]->path() + "'";
  throw ConfigError("weight " + name + " is missing: none of " + where + " holds it" +
                    (aliases.empty() ? "" : " (nor its tied names)"));
}

void check_init_weights(const OpGraph& graph) {
  if (graph.weight_files.size() < 2) return;
  const SafetensorsFile file(graph.weight_files.front());
  std::string first;
  int64_t problems = 0;
  for (const Node& node : graph.nodes)
    for (const ParamSpec& spec : node.params) {
      if (spec.tied() || spec.init != Init::File) continue;
      std::vector<std::string> names{spec.source};
      names.insert(names.end(), spec.aliases.begin(), spec.aliases.end());
      std::string problem = "weight " + spec.source + " is missing";
      std::optional<Shape> shape;
      for (const std::string& n : names)
        if (file.contains(n)) {
          shape = file.entry(n).shape;
          break;
        }
      if (!shape)
        if (const std::optional<SavedAs> saved = saved_as(file, spec.source)) shape = assembled_shape(file, *saved);
      if (shape)
        problem = *shape == spec.shape ? ""
                                       : "weight " + spec.source + " has shape " + shape_str(*shape) +
                                             ", the model needs " + shape_str(spec.shape);
      if (problem.empty()) continue;
      if (problems++ == 0) first = problem;
    }
  if (problems == 0) return;
  throw ConfigError(
      "--init-from '" + file.path() + "' does not fit " + graph.preset + ": " + first +
      (problems > 1 ? " (and " + std::to_string(problems - 1) + " more weights missing or of another shape)" : "") +
      "; give a checkpoint of this model");
}

}  // namespace dawnpiper
