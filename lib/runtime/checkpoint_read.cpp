#include "runtime/checkpoint.h"

#include <ATen/core/grad_mode.h>

#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "runtime/checkpoint_files.h"
#include "util/error.h"
#include "util/files.h"
#include "util/hdf5_io.h"
#include "util/json.h"

// Reading checkpoints back (runtime/checkpoint.h): on the layout that wrote them, by name, or
// through the manifest's index on any layout; and the parameters alone, for export-weights.
namespace dawnpiper {

using namespace h5;
using namespace checkpoint_files;

namespace {

// `state_path`: where this replica's optimizer state is, when not in `path` (ZeRO, replica > 0).
void read_stage_file(const std::string& path, PipelineStage& stage, const CheckpointIdentity& id,
                     const std::string& state_path) {
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, "open " + path);
  auto mismatch = [&](const std::string& what, const std::string& have, const std::string& want) {
    return ConfigError("checkpoint '" + path + "' is for " + what + " " + have + ", this run has " + want);
  };
  if (!has_attr(file, "format") || read_attr_string(file, "format") != "dawnpiper-checkpoint")
    throw ConfigError("'" + path + "' is not a DawnPiper checkpoint");
  if (read_attr_string(file, "preset") != id.preset || read_attr<int64_t>(file, "nodes") != id.nodes)
    throw mismatch("model", read_attr_string(file, "preset"), id.preset);
  if (read_attr<int64_t>(file, "stages") != id.stages)
    throw mismatch("stages", std::to_string(read_attr<int64_t>(file, "stages")), std::to_string(id.stages));
  if (read_attr<int64_t>(file, "node_begin") != stage.config().program.begin ||
      read_attr<int64_t>(file, "node_end") != stage.config().program.end)
    throw ConfigError("checkpoint '" + path +
                      "' holds another split of the model (re-use the plan it was trained with: --plan-in)");
  if (read_attr_string(file, "optimizer") != id.optimizer)
    throw mismatch("optimizer", read_attr_string(file, "optimizer"), id.optimizer);
  // Files before ZeRO hold level 0's whole state.
  const auto [zero_stage, replicas] = sharding_of(stage);
  const int64_t saved_stage = has_attr(file, "zero_stage") ? read_attr<int64_t>(file, "zero_stage") : 0;
  const int64_t saved_replicas = has_attr(file, "replicas") ? read_attr<int64_t>(file, "replicas") : 1;
  if ((saved_stage > 0 || zero_stage > 0) && (saved_stage != zero_stage || saved_replicas != replicas))
    throw ConfigError("checkpoint '" + path + "' was written at --zero-stage " + std::to_string(saved_stage) +
                      " with --data-parallel " + std::to_string(saved_replicas) + ", and this run has --zero-stage " +
                      std::to_string(zero_stage) + " with --data-parallel " + std::to_string(replicas) +
                      ": a sharded checkpoint resumes only in the layout it was written in");
  at::NoGradGuard no_grad;
  Handle params(H5Gopen2(file, "parameters", H5P_DEFAULT), H5Gclose, "open group parameters");
  const std::vector<std::string> names = read_strings(params, "names");
  auto& ps = stage.module().parameters();
  if (names.size() != ps.size()) throw ConfigError("checkpoint '" + path + "' holds another set of parameters");
  for (size_t i = 0; i < ps.size(); ++i) {
    if (names[i] != ps[i].name)
      throw ConfigError("checkpoint '" + path + "' holds " + names[i] + " where this stage has " + ps[i].name);
    at::Tensor host = at::empty(ps[i].tensor.sizes(), at::kFloat);
    read_floats(params, std::to_string(i), host.data_ptr<float>(), static_cast<size_t>(host.numel()));
    ps[i].tensor.copy_(host);
  }
  std::optional<Handle> state_file;
  if (!state_path.empty()) {
    quiet_errors();
    if (H5Fis_hdf5(state_path.c_str()) <= 0)
      throw ConfigError("checkpoint file '" + state_path + "' is missing or unreadable");
    state_file.emplace(H5Fopen(state_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, "open " + state_path);
    if (read_attr<int64_t>(*state_file, "optimizer_steps") != read_attr<int64_t>(file, "optimizer_steps") ||
        read_attr<int64_t>(*state_file, "replica") != stage.config().replica)
      throw ConfigError("checkpoint file '" + state_path + "' does not belong with '" + path + "'");
  }
  Handle state(
      H5Gopen2(state_file ? static_cast<hid_t>(*state_file) : static_cast<hid_t>(file), "optimizer_state", H5P_DEFAULT),
      H5Gclose, "open group optimizer_state");
  std::vector<at::Tensor> s = stage.optimizer().state();
  const auto& owners = stage.optimizer().params();
  for (size_t i = 0; i < s.size(); ++i) {
    const std::string name = std::to_string(i);
    if (H5Lexists(state, name.c_str(), H5P_DEFAULT) <= 0) {
      s[i] = at::Tensor();
      continue;
    }
    const at::Tensor& owner = owners[i % owners.size()];  // state i belongs to parameter i mod count
    at::Tensor host = at::empty(owner.sizes(), at::kFloat);
    read_floats(state, name, host.data_ptr<float>(), static_cast<size_t>(host.numel()));
    s[i] = host.to(owner.device());
  }
  stage.optimizer().restore(s, read_attr<int64_t>(file, "optimizer_steps"));
}

// Whether `path` holds this stage as the run's plan cuts it (same stage count and node range).
bool same_split(const std::string& path, PipelineStage& stage, const CheckpointIdentity& id) {
  if (H5Fis_hdf5(path.c_str()) <= 0) return false;
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, "open " + path);
  return has_attr(file, "stages") && read_attr<int64_t>(file, "stages") == id.stages &&
         read_attr<int64_t>(file, "node_begin") == stage.config().program.begin &&
         read_attr<int64_t>(file, "node_end") == stage.config().program.end;
}

// A checkpoint of another split (level 0: each file holds its stage's whole optimizer state):
// every parameter of this stage and its optimizer state found by model name in whichever stage
// file holds it (the lowest stage's, for a tied weight).
void read_by_name(const std::string& dir, int64_t step, PipelineStage& stage, const CheckpointIdentity& id) {
  struct Source {
    std::string path;
    size_t index = 0, count = 0;
  };
  std::map<std::string, Source> sources;
  std::map<int64_t, std::string> files;
  for (const std::string& name : list_directory(step_dir(dir, step))) {
    if (name.rfind("stage-", 0) != 0 || name.size() <= 9 || name.compare(name.size() - 3, 3, ".h5") != 0) continue;
    const std::string number = name.substr(6, name.size() - 9);
    if (number.empty() || number.find_first_not_of("0123456789") != std::string::npos) continue;
    files[std::stoll(number)] = step_dir(dir, step) + "/" + name;
  }
  if (files.empty()) throw ConfigError("there is no checkpoint " + step_dir(dir, step) + " (no stage-<x>.h5 in it)");
  std::map<std::string, std::unique_ptr<Handle>> open;
  for (const auto& [x, path] : files) {
    auto file = std::make_unique<Handle>(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, "open " + path);
    if (!has_attr(*file, "format") || read_attr_string(*file, "format") != "dawnpiper-checkpoint")
      throw ConfigError("'" + path + "' is not a DawnPiper checkpoint");
    if (read_attr_string(*file, "preset") != id.preset || read_attr<int64_t>(*file, "nodes") != id.nodes)
      throw ConfigError("checkpoint '" + path + "' is for model " + read_attr_string(*file, "preset") +
                        ", this run has " + id.preset);
    if (read_attr_string(*file, "optimizer") != id.optimizer)
      throw ConfigError("checkpoint '" + path + "' is for optimizer " + read_attr_string(*file, "optimizer") +
                        ", this run has " + id.optimizer);
    if (has_attr(*file, "zero_stage") && read_attr<int64_t>(*file, "zero_stage") > 0)
      throw ConfigError("checkpoint '" + path +
                        "' holds a sharded optimizer state: it resumes only in the layout it was written in");
    Handle params(H5Gopen2(*file, "parameters", H5P_DEFAULT), H5Gclose, "open group parameters");
    const std::vector<std::string> names = read_strings(params, "names");
    for (size_t i = 0; i < names.size(); ++i) sources.emplace(names[i], Source{path, i, names.size()});
    open[path] = std::move(file);
  }
  at::NoGradGuard no_grad;
  auto& ps = stage.module().parameters();
  std::vector<const Source*> from(ps.size());
  for (size_t j = 0; j < ps.size(); ++j) {
    auto it = sources.find(ps[j].name);
    if (it == sources.end())
      throw ConfigError("checkpoint " + step_dir(dir, step) + " holds no parameter " + ps[j].name +
                        " (a checkpoint of another model?)");
    from[j] = &it->second;
    Handle params(H5Gopen2(*open[it->second.path], "parameters", H5P_DEFAULT), H5Gclose, "open group parameters");
    at::Tensor host = at::empty(ps[j].tensor.sizes(), at::kFloat);
    try {
      read_floats(params, std::to_string(it->second.index), host.data_ptr<float>(), static_cast<size_t>(host.numel()));
    } catch (const std::runtime_error&) {
      throw ConfigError("checkpoint file '" + it->second.path + "' holds " + ps[j].name +
                        " with another shape than this model's");
    }
    ps[j].tensor.copy_(host);
  }
  std::vector<at::Tensor> s = stage.optimizer().state();
  const auto& owners = stage.optimizer().params();
  for (size_t i = 0; i < s.size(); ++i) {
    const size_t j = i % owners.size(), moment = i / owners.size();  // state i: parameter i mod count
    const Source& src = *from[j];
    Handle state(H5Gopen2(*open[src.path], "optimizer_state", H5P_DEFAULT), H5Gclose, "open group optimizer_state");
    const std::string name = std::to_string(moment * src.count + src.index);
    if (H5Lexists(state, name.c_str(), H5P_DEFAULT) <= 0) {
      s[i] = at::Tensor();
      continue;
    }
    at::Tensor host = at::empty(owners[j].sizes(), at::kFloat);
    read_floats(state, name, host.data_ptr<float>(), static_cast<size_t>(host.numel()));
    s[i] = host.to(owners[j].device());
  }
  const std::string& first = from.empty() ? files.begin()->second : from.front()->path;
  stage.optimizer().restore(s, read_attr<int64_t>(*open[first], "optimizer_steps"));
}

// What is wrong with the index's entry for parameter `name` of `shape` ("" where it is there with
// that shape), as "holds no parameter N" or "holds N with shape [..], this model's is [..]".
std::string entry_mismatch(const Json& index, const std::string& where, const std::string& name,
                           const std::vector<int64_t>& shape) {
  if (!index.contains(name)) return "checkpoint " + where + " holds no parameter " + name;
  if (index[name]["shape"].get<std::vector<int64_t>>() != shape)
    return "checkpoint " + where + " holds " + name + " with shape " + index[name]["shape"].dump() +
           ", this model's is " + Json(shape).dump();
  return "";
}

// Through the manifest's index (any layout: another split, replica count or sharding level):
// each parameter of the stage from the file that holds it, and each tensor its optimizer updates
// (a whole parameter, or a piece of this replica's shard) from the slices that overlap it, each
// slice read alone. Only the files holding them are opened.
void read_by_index(const std::string& dir, int64_t step, PipelineStage& stage, const CheckpointIdentity& id,
                   const Json& manifest) {
  const std::string where = step_dir(dir, step);
  const Json& model = manifest["model"];
  if (model.value("preset", std::string()) != id.preset || model.value("nodes", int64_t{0}) != id.nodes)
    throw ConfigError("checkpoint " + where + " is for model " + model.value("preset", std::string()) +
                      ", this run has " + id.preset);
  const Json& optimizer = manifest["optimizer"];
  if (optimizer.value("kind", std::string()) != id.optimizer)
    throw ConfigError("checkpoint " + where + " is for optimizer " + optimizer.value("kind", std::string()) +
                      ", this run has " + id.optimizer);
  const Json& index = manifest["index"];
  std::map<std::string, std::unique_ptr<Handle>> open;
  // Elements [offset, offset + count) of the dataset `at` names (a file and "group/dataset") of
  // `total` elements.
  auto read = [&](const Json& at, int64_t total, int64_t offset, float* data, int64_t count) {
    const std::string file = at["file"].get<std::string>(), dataset = at["dataset"].get<std::string>();
    std::unique_ptr<Handle>& h = open[file];
    const std::string path = where + "/" + file;
    if (!h) h = std::make_unique<Handle>(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, "open " + path);
    const size_t slash = dataset.find('/');
    Handle g(H5Gopen2(*h, dataset.substr(0, slash).c_str(), H5P_DEFAULT), H5Gclose, "open group in " + path);
    read_float_range(g, dataset.substr(slash + 1), total, offset, data, count);
  };
  // A parameter's copy: the one a stage of this stage's node range wrote (its own copy of a tied
  // weight, which async updates apart), else the lowest stage's.
  const Json nodes = {stage.config().program.begin, stage.config().program.end};
  auto copy_for = [&](const Json& entry) -> const Json& {
    for (const Json& copy : entry["copies"])
      if (copy["nodes"] == nodes) return copy;
    return entry["copies"].front();
  };
  at::NoGradGuard no_grad;
  auto& ps = stage.module().parameters();
  for (StageParameter& p : ps) {
    if (const std::string wrong = entry_mismatch(index, where, p.name, p.tensor.sizes().vec()); !wrong.empty())
      throw ConfigError(wrong + " (a checkpoint of another model?)");
    const Json& entry = index[p.name];
    at::Tensor host = at::empty(p.tensor.sizes(), at::kFloat);
    read(copy_for(entry), host.numel(), 0, host.data_ptr<float>(), host.numel());
    p.tensor.copy_(host);
  }
  const std::vector<StateOwner> owners = state_owners(stage);
  std::vector<at::Tensor> s = stage.optimizer().state();
  for (size_t i = 0; i < s.size(); ++i) {
    const StateOwner& o = owners[i % owners.size()];
    const int64_t moment = static_cast<int64_t>(i / owners.size());
    const StageParameter& p = ps[o.param];
    const Json& copy = copy_for(index[p.name]);
    at::Tensor host = at::empty({o.numel}, at::kFloat);
    int64_t covered = 0;
    for (const Json& slice : copy.contains("state") ? copy["state"] : Json::array()) {
      if (slice["moment"].get<int64_t>() != moment) continue;
      const int64_t from = slice["offset"].get<int64_t>(), n = slice["numel"].get<int64_t>();
      const int64_t lo = std::max(from, o.offset), hi = std::min(from + n, o.offset + o.numel);
      if (lo >= hi) continue;
      read(slice, n, lo - from, host.data_ptr<float>() + (lo - o.offset), hi - lo);
      covered += hi - lo;
    }
    if (covered == 0) {  // (an optimizer without this state yet, e.g. before its first update)
      s[i] = at::Tensor();
      continue;
    }
    if (covered != o.numel)
      throw ConfigError("checkpoint " + where + " holds " + std::to_string(covered) + " of the " +
                        std::to_string(o.numel) + " optimizer-state elements of " + p.name +
                        " this stage needs (a slice is missing)");
    const at::Tensor& owner = stage.optimizer().params()[i % owners.size()];
    s[i] = host.view(owner.sizes()).to(owner.device());
  }
  stage.optimizer().restore(s, optimizer.value("steps", int64_t{0}));
}

// The manifest of checkpoint `step` where it has an index (written since checkpoints move).
std::optional<Json> indexed_manifest(const std::string& dir, int64_t step) {
  if (!std::ifstream(manifest_path(dir, step)).good()) return std::nullopt;
  Json m = Json::parse(read_text_file(manifest_path(dir, step)));
  if (!m.contains("index")) return std::nullopt;
  return m;
}

}  // namespace

bool checkpoint_moves(const std::string& dir, int64_t step) {
  try {
    return indexed_manifest(dir, step).has_value();
  } catch (const std::exception&) {
    return false;
  }
}

std::string checkpoint_parameter_mismatch(const std::string& dir, int64_t step,
                                          const std::vector<std::pair<std::string, std::vector<int64_t>>>& params) {
  std::optional<Json> manifest;
  try {
    manifest = indexed_manifest(dir, step);
  } catch (const std::exception&) {
    return "";  // (a damaged manifest is checked_resume_step's to name)
  }
  if (!manifest) return "";
  const Json& index = (*manifest)["index"];
  const std::string where = step_dir(dir, step);
  std::set<std::string> names;
  for (const auto& [name, shape] : params) {
    names.insert(name);
    if (std::string wrong = entry_mismatch(index, where, name, shape); !wrong.empty()) return wrong;
  }
  for (const auto& [name, entry] : index.items())
    if (!names.count(name)) return "checkpoint " + where + " holds " + name + ", which this model has not";
  return "";
}

void read_checkpoint(const std::string& dir, int64_t step, PipelineStage& stage, const CheckpointIdentity& id) {
  const std::string path = stage_file(dir, step, stage.config().program.stage);
  const int replica = stage.zero_shard() ? stage.config().replica : 0;
  const std::string state_path = replica > 0 ? stage_file(dir, step, stage.config().program.stage, replica) : "";
  quiet_errors();
  try {
    if (const std::optional<Json> manifest = indexed_manifest(dir, step))
      return read_by_index(dir, step, stage, id, *manifest);
    if (!stage.zero_shard() && !same_split(path, stage, id)) return read_by_name(dir, step, stage, id);
    if (H5Fis_hdf5(path.c_str()) <= 0) throw ConfigError("checkpoint file '" + path + "' is missing or unreadable");
    read_stage_file(path, stage, id, state_path);
  } catch (const Error&) {
    throw;
  } catch (const std::runtime_error& e) {  // HDF5 or a dataset of the wrong size: a damaged file
    throw ConfigError("checkpoint file '" + path + "' is truncated or corrupt (" + e.what() +
                      "); resume from an earlier checkpoint with --resume-from STEP (kept: --keep-checkpoints), "
                      "or start without --resume");
  }
}

std::vector<CheckpointTensor> checkpoint_parameters(const std::string& dir, int64_t step) {
  if (const std::string problem = checkpoint_damage(dir, step, /*unchecked_ok=*/true); !problem.empty())
    throw ConfigError(problem);
  // stage-<x>.h5 (replica 0's: the parameters) by stage.
  std::map<int64_t, std::string> files;
  for (const std::string& name : list_directory(step_dir(dir, step))) {
    const size_t end = name.size() - 3;
    if (name.rfind("stage-", 0) != 0 || name.size() <= 9 || name.compare(end, 3, ".h5") != 0) continue;
    const std::string number = name.substr(6, end - 6);
    if (number.empty() || number.find_first_not_of("0123456789") != std::string::npos) continue;
    files[std::stoll(number)] = step_dir(dir, step) + "/" + name;
  }
  if (files.empty()) throw ConfigError("there is no checkpoint " + step_dir(dir, step) + " (no stage-<x>.h5 in it)");
  std::vector<CheckpointTensor> out;
  std::set<std::string> seen;
  int64_t expected = 0;
  quiet_errors();
  for (const auto& [x, path] : files) {
    if (x != expected++)
      throw ConfigError("checkpoint file '" + step_dir(dir, step) + "/stage-" + std::to_string(x - 1) +
                        ".h5' is missing");
    try {
      Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, "open " + path);
      if (!has_attr(file, "format") || read_attr_string(file, "format") != "dawnpiper-checkpoint")
        throw ConfigError("'" + path + "' is not a DawnPiper checkpoint");
      if (x == 0 && read_attr<int64_t>(file, "stages") != static_cast<int64_t>(files.size()))
        throw ConfigError("checkpoint " + step_dir(dir, step) + " holds " + std::to_string(files.size()) +
                          " stage files of its " + std::to_string(read_attr<int64_t>(file, "stages")) + " stages");
      Handle params(H5Gopen2(file, "parameters", H5P_DEFAULT), H5Gclose, "open group parameters");
      if (H5Lexists(params, "shapes", H5P_DEFAULT) <= 0)
        throw ConfigError("checkpoint file '" + path +
                          "' was written before checkpoints kept their parameters' shapes: resume it for a step "
                          "with this version to write one that exports");
      const std::vector<std::string> names = read_strings(params, "names");
      const std::vector<std::vector<int>> shapes = read_lists(params, "shapes");
      for (size_t i = 0; i < names.size() && i < shapes.size(); ++i) {
        if (!seen.insert(names[i]).second) continue;  // a tied weight: the lowest stage's
        CheckpointTensor t;
        t.name = names[i];
        int64_t count = 1;
        for (int d : shapes[i]) t.shape.push_back(d), count *= d;
        t.values.resize(static_cast<size_t>(count));
        read_floats(params, std::to_string(i), t.values.data(), t.values.size());
        out.push_back(std::move(t));
      }
    } catch (const Error&) {
      throw;
    } catch (const std::runtime_error& e) {
      throw ConfigError("checkpoint file '" + path + "' is truncated or corrupt (" + e.what() + ")");
    }
  }
  return out;
}

}  // namespace dawnpiper
