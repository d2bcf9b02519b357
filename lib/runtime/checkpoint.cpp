#include "runtime/checkpoint.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "runtime/checkpoint_files.h"
#include "runtime/mpi_wait.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/files.h"
#include "util/hdf5_io.h"
#include "util/json.h"

// Writing checkpoints, the manifest and its index, and keeping and checking them
// (runtime/checkpoint.h); reading them back is checkpoint_read.cpp.
namespace dawnpiper {

using namespace h5;
using namespace checkpoint_files;

namespace {

void write_tensor(hid_t group, const std::string& name, const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kCPU).contiguous();
  if (c.scalar_type() != at::kFloat) throw std::logic_error("checkpoint: only float32 tensors are supported");
  write_floats(group, name, c.data_ptr<float>(), static_cast<size_t>(c.numel()));
}

// The checkpoint that `step` follows on its run's line: the one its manifest names ("after"),
// or for a manifest without it (written before manifests named it, or where no `latest` was
// there to name one) the newest complete one before it; -1 where none.
int64_t followed(const std::string& dir, int64_t step, const std::vector<int64_t>& steps) {
  try {
    const Json m = Json::parse(read_text_file(manifest_path(dir, step)));
    if (m.contains("after")) return m["after"].get<int64_t>();
  } catch (const std::exception&) {
    return -1;
  }
  for (int64_t earlier : steps)  // newest first
    if (earlier < step && is_complete(dir, earlier)) return earlier;
  return -1;
}

// Keeps the `keep` newest complete checkpoints of the line that ends at `written` (the one just
// completed), following each manifest's "after" back; removes every other step directory: older
// ones past K, incomplete ones, those past `written`, and those a resumed run abandoned by going
// on from an earlier step (--resume-from), damaged or not.
void prune(const std::string& dir, int64_t written, int keep) {
  const std::vector<int64_t> steps = step_directories(dir);
  std::set<int64_t> kept{written};
  for (int64_t at = written; static_cast<int>(kept.size()) < keep;) {
    const int64_t next = followed(dir, at, steps);
    if (next < 0 || next >= at || !is_complete(dir, next)) break;
    kept.insert(next);
    at = next;
  }
  for (int64_t step : steps)
    if (!kept.count(step)) remove_tree(step_dir(dir, step));
}

// One line of the index (write_checkpoint gathers them at rank 0), tab-separated: the stage and
// its node range, the file, the tensor's model name, its dataset, the moment (-1: the parameter
// itself), the slice of its flattened elements, and its shape.
std::string index_line(const StageConfig& stage, const std::string& file, const StageParameter& p,
                       const std::string& dataset, int64_t moment, int64_t offset, int64_t numel) {
  std::string shape;
  for (int64_t d : p.tensor.sizes()) shape += (shape.empty() ? "" : ",") + std::to_string(d);
  return std::to_string(stage.program.stage) + "\t" + std::to_string(stage.program.begin) + "\t" +
         std::to_string(stage.program.end) + "\t" + file + "\t" + p.name + "\t" + dataset + "\t" +
         std::to_string(moment) + "\t" + std::to_string(offset) + "\t" + std::to_string(numel) + "\t" + shape + "\n";
}

// Writes the stage's file; returns its path and its lines of the index.
std::pair<std::string, std::string> write_stage_file(const std::string& dir, int64_t next_step, PipelineStage& stage,
                                                     const CheckpointIdentity& id) {
  const auto [zero_stage, replicas] = sharding_of(stage);
  const int replica = zero_stage > 0 ? stage.config().replica : 0;
  const std::string path = stage_file(dir, next_step, stage.config().program.stage, replica);
  write_atomically(path, [&](const std::string& tmp) {
    quiet_errors();
    Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose, "create " + path);
    write_attr(file, "format", "dawnpiper-checkpoint");
    write_attr<int64_t>(file, "schema_version", 1);
    write_attr(file, "preset", id.preset);
    write_attr(file, "optimizer", id.optimizer);
    write_attr<int64_t>(file, "nodes", id.nodes);
    write_attr<int64_t>(file, "stages", id.stages);
    write_attr<int64_t>(file, "stage", stage.config().program.stage);
    write_attr<int64_t>(file, "node_begin", stage.config().program.begin);
    write_attr<int64_t>(file, "node_end", stage.config().program.end);
    write_attr<int64_t>(file, "next_step", next_step);
    write_attr<int64_t>(file, "optimizer_steps", stage.optimizer().steps());
    write_attr<int64_t>(file, "zero_stage", zero_stage);
    write_attr<int64_t>(file, "replicas", replicas);
    write_attr<int64_t>(file, "replica", replica);
    if (replica == 0) {  // the replicas hold the same parameters: replica 0 writes them
      Handle params(H5Gcreate2(file, "parameters", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose, "create group");
      // Datasets by index (names may hold '/'); the names column lets a reader check the match.
      std::vector<std::string> names;
      std::vector<std::vector<int>> shapes;
      for (size_t i = 0; i < stage.module().parameters().size(); ++i) {
        const StageParameter& p = stage.module().parameters()[i];
        write_tensor(params, std::to_string(i), p.tensor);
        names.push_back(p.name);
        shapes.emplace_back(p.tensor.sizes().begin(), p.tensor.sizes().end());
      }
      write_strings(params, "names", names);
      write_lists(params, "shapes", shapes);  // export-weights writes them without the model
    }
    Handle state(H5Gcreate2(file, "optimizer_state", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose, "create group");
    const std::vector<at::Tensor> s = stage.optimizer().state();
    for (size_t i = 0; i < s.size(); ++i)
      if (s[i].defined()) write_tensor(state, std::to_string(i), s[i]);
  });
  const std::string file = path.substr(path.rfind('/') + 1);
  const StageConfig& x = stage.config();
  const auto& ps = stage.module().parameters();
  std::string index;
  if (replica == 0)
    for (size_t i = 0; i < ps.size(); ++i)
      index += index_line(x, file, ps[i], "parameters/" + std::to_string(i), -1, 0, ps[i].tensor.numel());
  const std::vector<StateOwner> owners = state_owners(stage);
  const std::vector<at::Tensor> s = stage.optimizer().state();
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i].defined()) {
      const StateOwner& o = owners[i % owners.size()];
      index += index_line(x, file, ps[o.param], "optimizer_state/" + std::to_string(i),
                          static_cast<int64_t>(i / owners.size()), o.offset, o.numel);
    }
  return {path, index};
}

// The manifest's index from every rank's lines: per model name its shape and its copies, one per
// stage holding it (a weight tied across stages has several; equal under the synchronous
// schedules, each stage's own under async), by stage: the stage's node range, the file and
// dataset of the parameter, and the slices of its optimizer state, by moment, from that stage's
// files (its replicas' shards under ZeRO).
Json checkpoint_index(const std::string& lines) {
  std::map<std::string, std::map<int, Json>> copies;  // per name, per stage
  std::map<std::string, std::vector<int64_t>> shapes;
  std::istringstream in(lines);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> f;
    for (size_t at = 0;;) {
      const size_t tab = line.find('\t', at);
      f.push_back(line.substr(at, tab == std::string::npos ? std::string::npos : tab - at));
      if (tab == std::string::npos) break;
      at = tab + 1;
    }
    if (f.size() != 10) throw std::logic_error("checkpoint index line: " + line);
    const int stage = std::stoi(f[0]);
    std::vector<int64_t>& shape = shapes[f[4]];
    shape.clear();
    for (size_t at = 0; at < f[9].size();) {
      const size_t comma = std::min(f[9].find(',', at), f[9].size());
      shape.push_back(std::stoll(f[9].substr(at, comma - at)));
      at = comma + 1;
    }
    Json& copy = copies[f[4]][stage];
    copy["stage"] = stage;
    copy["nodes"] = {std::stoll(f[1]), std::stoll(f[2])};
    const int64_t moment = std::stoll(f[6]);
    if (moment < 0) {
      copy["file"] = f[3];
      copy["dataset"] = f[5];
      continue;
    }
    if (!copy.contains("state")) copy["state"] = Json::array();
    copy["state"].push_back({{"file", f[3]},
                             {"dataset", f[5]},
                             {"moment", moment},
                             {"offset", std::stoll(f[7])},
                             {"numel", std::stoll(f[8])}});
  }
  Json index = Json::object();
  for (auto& [name, by_stage] : copies) {
    Json& entry = index[name];
    entry["shape"] = shapes.at(name);
    entry["copies"] = Json::array();
    for (auto& [stage, copy] : by_stage) entry["copies"].push_back(std::move(copy));
  }
  return index;
}

}  // namespace

void write_checkpoint(const std::string& dir, int64_t next_step, const std::vector<PipelineStage*>& stages,
                      const CheckpointIdentity& id, MPI_Comm comm, MPI_Comm replicas, int keep) {
  int rank = 0, replica = 0;
  MPI_Comm_rank(comm, &rank);
  if (replicas != MPI_COMM_NULL) MPI_Comm_rank(replicas, &replica);
  const bool root = rank == 0 && replica == 0;
  make_directories(step_dir(dir, next_step));
  // A manifest of this step left by an abandoned run no longer describes its files.
  if (root) std::remove(manifest_path(dir, next_step).c_str());
  std::string sums, index;  // a line per file: name, bytes, checksum; the index's lines
  int64_t optimizer_steps = 0;
  for (PipelineStage* stage : stages) {
    const auto [path, lines] = write_stage_file(dir, next_step, *stage, id);
    const FileSum sum = file_sum(path);
    if (sum.bytes < 0) throw ConfigError("cannot read back the checkpoint file '" + path + "' just written");
    sums += path.substr(path.rfind('/') + 1) + " " + std::to_string(sum.bytes) + " " + hex(sum.sum) + "\n";
    index += lines;
    optimizer_steps = stage->optimizer().steps();
  }
  // Every stage has its file once rank 0 has every rank's lines (each stage's replicas to
  // replica 0, then the pipeline of replica 0 to its rank 0); then the manifest and `latest`.
  if (replicas != MPI_COMM_NULL)
    sums = gather_string_quietly(sums, replicas), index = gather_string_quietly(index, replicas);
  sums = gather_string_quietly(sums, comm);
  index = gather_string_quietly(index, comm);
  if (!root) return;
  Json files = Json::object();
  std::istringstream lines(sums);
  std::string name, checksum;
  int64_t bytes = 0;
  while (lines >> name >> bytes >> checksum) files[name] = {{"bytes", bytes}, {"checksum", checksum}};
  Json manifest;
  manifest["format"] = "dawnpiper-checkpoint-manifest";
  manifest["step"] = next_step;
  // The checkpoint this one follows: the one `latest` names (a resumed run has pointed it at the
  // step it resumed from: continue_from_checkpoint).
  int64_t after = -1;
  if (std::ifstream in(dir + "/latest"); !(in >> after) || after >= next_step) after = -1;
  if (after >= 0) manifest["after"] = after;
  manifest["files"] = files;
  // What a run on any layout reads: the model, the optimizer and its update count, and where
  // each tensor and each slice of its optimizer state is.
  manifest["model"] = {{"preset", id.preset}, {"nodes", id.nodes}};
  manifest["optimizer"] = {{"kind", id.optimizer}, {"steps", optimizer_steps}};
  manifest["index"] = checkpoint_index(index);
  write_text_atomically(manifest_path(dir, next_step), manifest.dump(2) + "\n");
  write_text_atomically(dir + "/latest", std::to_string(next_step) + "\n");
  prune(dir, next_step, std::max(keep, 1));
}

std::string checkpoint_step_dir(const std::string& dir, int64_t step) { return step_dir(dir, step); }

void continue_from_checkpoint(const std::string& dir, int64_t step) {
  int64_t latest = -1;
  if (std::ifstream in(dir + "/latest"); !(in >> latest)) latest = -1;
  if (latest != step) write_text_atomically(dir + "/latest", std::to_string(step) + "\n");
}

std::vector<int64_t> complete_checkpoints(const std::string& dir) {
  std::vector<int64_t> steps;
  for (int64_t step : step_directories(dir))
    if (std::ifstream(manifest_path(dir, step)).good()) steps.push_back(step);
  return steps;
}

std::string checkpoint_damage(const std::string& dir, int64_t step, bool unchecked_ok) {
  const std::string where = step_dir(dir, step), manifest = manifest_path(dir, step);
  if (list_directory(where).empty()) return "there is no checkpoint " + where;
  if (!std::ifstream(manifest).good())
    return unchecked_ok ? "" : "checkpoint " + where + " is incomplete (no manifest.json: its writing did not finish)";
  Json m;
  try {
    m = Json::parse(read_text_file(manifest));
    if (!m.contains("files") || !m["files"].is_object()) throw std::runtime_error("no files");
  } catch (const std::exception&) {
    return "checkpoint file '" + manifest + "' is damaged (not the manifest it was written as)";
  }
  for (const auto& [name, want] : m["files"].items()) {
    const std::string path = where + "/" + name;
    const FileSum have = file_sum(path);
    const int64_t bytes = want.value("bytes", int64_t{-1});
    if (have.bytes < 0) return "checkpoint file '" + path + "' is missing or unreadable";
    if (have.bytes != bytes)
      return "checkpoint file '" + path + "' is truncated or corrupt (" + std::to_string(have.bytes) + " bytes, " +
             std::to_string(bytes) + " were written)";
    if (hex(have.sum) != want.value("checksum", std::string()))
      return "checkpoint file '" + path + "' is corrupt (its bytes do not match the checksum they were written with)";
  }
  return "";
}

int64_t checked_resume_step(const std::string& dir, int64_t requested) {
  // The newest complete, undamaged checkpoint before `before` (any: -1), or -1.
  auto newest_sound = [&](int64_t before, int64_t skip) -> int64_t {
    for (int64_t step : complete_checkpoints(dir))
      if ((before < 0 || step < before) && step != skip && checkpoint_damage(dir, step).empty()) return step;
    return -1;
  };
  auto way_on = [&](int64_t found, const char* which) {
    if (found < 0)
      return "; no " + std::string(which) + "complete checkpoint is kept in " + dir + ": train anew without --resume";
    return "; the newest complete " + std::string(which) + "checkpoint is step " + std::to_string(found) + " (" +
           step_dir(dir, found) + "): resume from it with --resume-from " + std::to_string(found);
  };
  if (requested >= 0) {
    int64_t latest = -1;
    if (std::ifstream in(dir + "/latest"); !(in >> latest)) latest = -1;
    const std::string problem = checkpoint_damage(dir, requested, requested == latest);
    if (problem.empty()) return requested;
    throw ConfigError("--resume-from " + std::to_string(requested) + ": " + problem +
                      way_on(newest_sound(-1, requested), ""));
  }
  std::ifstream in(dir + "/latest");
  int64_t step = -1;
  if (!in.good()) {
    if (complete_checkpoints(dir).empty() && step_directories(dir).empty())
      throw ConfigError("--resume: no complete checkpoint in '" + dir + "' (no readable '" + dir + "/latest')");
    throw ConfigError("--resume: '" + dir + "/latest' is missing" + way_on(newest_sound(-1, -1), ""));
  }
  std::string rest;
  if (!(in >> step) || step < 0 || (in >> rest))
    throw ConfigError("--resume: '" + dir + "/latest' is damaged (it names no step)" +
                      way_on(newest_sound(-1, -1), ""));
  const std::string problem = checkpoint_damage(dir, step, /*unchecked_ok=*/true);
  if (problem.empty()) return step;
  throw ConfigError("--resume: " + problem + way_on(newest_sound(step, step), "earlier "));
}

}  // namespace dawnpiper
