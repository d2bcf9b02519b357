#include "exec/weights.h"

#include <ATen/core/grad_mode.h>

#include "data/scalar_type.h"
#include "util/error.h"

namespace dawnpiper {

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
      at::Tensor view =
          at::from_blob(const_cast<void*>(file->data(e)), e.shape, at::TensorOptions(scalar_type(e.dtype)));
      return view.to(scalar_type(dtype), /*non_blocking=*/false, /*copy=*/true);
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
      for (const std::string& n : names)
        if (file.contains(n)) {
          const Shape& shape = file.entry(n).shape;
          problem = shape == spec.shape ? ""
                                        : "weight " + spec.source + " has shape " + shape_str(shape) +
                                              ", the model needs " + shape_str(spec.shape);
          break;
        }
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
