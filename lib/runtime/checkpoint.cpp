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

#include "runtime/mpi_wait.h"
#include "runtime/zero_shard.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/files.h"
#include "util/hdf5_io.h"
#include "util/json.h"

namespace dawnpiper {

using namespace h5;

namespace {

std::string step_dir(const std::string& dir, int64_t step) { return dir + "/step-" + std::to_string(step); }
std::string manifest_path(const std::string& dir, int64_t step) { return step_dir(dir, step) + "/manifest.json"; }
std::string stage_file(const std::string& dir, int64_t step, int stage, int replica = 0) {
  return step_dir(dir, step) + "/stage-" + std::to_string(stage) +
         (replica > 0 ? "-replica-" + std::to_string(replica) : std::string()) + ".h5";
}

// The sharding a stage's optimizer state has: ZeRO's level and replica count, or 0 and 1.
std::pair<int64_t, int64_t> sharding_of(PipelineStage& stage) {
  if (!stage.zero_shard()) return {0, stage.config().replicas};
  return {stage.zero_shard()->level(), stage.config().replicas};
}

void write_tensor(hid_t group, const std::string& name, const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kCPU).contiguous();
  if (c.scalar_type() != at::kFloat) throw std::logic_error("checkpoint: only float32 tensors are supported");
  write_floats(group, name, c.data_ptr<float>(), static_cast<size_t>(c.numel()));
}

// A file's size and a 64-bit checksum of its bytes (words multiplied and mixed: several GB/s,
// enough to tell a damaged file from the one written). Size -1: it cannot be read.
struct FileSum {
  int64_t bytes = -1;
  uint64_t sum = 0;
};
FileSum file_sum(const std::string& path) {
  FileSum r;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return r;
  std::vector<uint64_t> words(size_t{1} << 17);  // 1 MiB
  uint64_t h = 0x243F6A8885A308D3ull;
  int64_t bytes = 0;
  for (;;) {
    const size_t n = std::fread(words.data(), 1, words.size() * 8, f);
    if (n == 0) break;
    if (n % 8)
      std::fill(reinterpret_cast<char*>(words.data()) + n, reinterpret_cast<char*>(words.data()) + (n + 7) / 8 * 8, 0);
    for (size_t i = 0; i < (n + 7) / 8; ++i) {
      h = (h ^ words[i]) * 0x9E3779B97F4A7C15ull;
      h ^= h >> 29;
    }
    bytes += static_cast<int64_t>(n);
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return r;
  r.bytes = bytes;
  r.sum = (h ^ static_cast<uint64_t>(bytes)) * 0xBF58476D1CE4E5B9ull;
  return r;
}
std::string hex(uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof text, "%016" PRIx64, v);
  return text;
}

// The step numbers of DIR's step-<k> directories.
std::vector<int64_t> step_directories(const std::string& dir) {
  std::vector<int64_t> steps;
  for (const std::string& name : list_directory(dir)) {
    if (name.rfind("step-", 0) != 0 || name.size() == 5) continue;
    if (name.find_first_not_of("0123456789", 5) != std::string::npos) continue;
    steps.push_back(std::stoll(name.substr(5)));
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

bool is_complete(const std::string& dir, int64_t step) { return std::ifstream(manifest_path(dir, step)).good(); }

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

}  // namespace

namespace {

// The tensors the stage's optimizer updates (optimizer().params(), whose state is state()'s, the
// moments one after another) as slices of its parameters' flattened elements: below ZeRO level 1
// each whole parameter, at levels 1-3 the pieces of the replica's shard.
struct StateOwner {
  size_t param = 0;
  int64_t offset = 0, numel = 0;
};
std::vector<StateOwner> state_owners(PipelineStage& stage) {
  std::vector<StateOwner> owners;
  const auto& ps = stage.module().parameters();
  if (const ZeroShard* zero = stage.zero_shard())
    for (const ShardLayout::Piece& piece : zero->layout().pieces)
      owners.push_back({piece.param, piece.offset, piece.numel});
  else
    for (size_t i = 0; i < ps.size(); ++i) owners.push_back({i, 0, ps[i].tensor.numel()});
  if (owners.size() != stage.optimizer().params().size())
    throw std::logic_error("checkpoint: the optimizer updates other tensors than the stage's parameters");
  return owners;
}

// One line of the index (write_checkpoint gathers them at rank 0), tab-separated: the stage, the
// file, the tensor's model name, its dataset, the moment (-1: the parameter itself), the slice of
// its flattened elements, and its shape.
std::string index_line(int stage, const std::string& file, const StageParameter& p, const std::string& dataset,
                       int64_t moment, int64_t offset, int64_t numel) {
  std::string shape;
  for (int64_t d : p.tensor.sizes()) shape += (shape.empty() ? "" : ",") + std::to_string(d);
  return std::to_string(stage) + "\t" + file + "\t" + p.name + "\t" + dataset + "\t" + std::to_string(moment) + "\t" +
         std::to_string(offset) + "\t" + std::to_string(numel) + "\t" + shape + "\n";
}

// Writes the stage's file; returns its path and its lines of the index.
std::pair<std::string, std::string> write_stage_file(const std::string& dir, int64_t next_step, PipelineStage& stage,
                                                     const CheckpointIdentity& id) {
  const auto [zero_stage, replicas] = sharding_of(stage);
  const int replica = zero_stage > 0 ? stage.config().replica : 0;
  const std::string path = stage_file(dir, next_step, stage.config().stage, replica);
  write_atomically(path, [&](const std::string& tmp) {
    quiet_errors();
    Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose, "create " + path);
    write_attr(file, "format", "dawnpiper-checkpoint");
    write_attr<int64_t>(file, "schema_version", 1);
    write_attr(file, "preset", id.preset);
    write_attr(file, "optimizer", id.optimizer);
    write_attr<int64_t>(file, "nodes", id.nodes);
    write_attr<int64_t>(file, "stages", id.stages);
    write_attr<int64_t>(file, "stage", stage.config().stage);
    write_attr<int64_t>(file, "node_begin", stage.config().begin);
    write_attr<int64_t>(file, "node_end", stage.config().end);
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
  const int x = stage.config().stage;
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

// The manifest's index from every rank's lines: per model name, its shape, where the parameter
// is (the lowest stage holding it: a tied weight's copies are equal), and the slices of its
// optimizer state, by moment, from that stage's files (its replicas' shards under ZeRO).
Json checkpoint_index(const std::string& lines) {
  Json index = Json::object();
  std::map<std::string, int> lowest;  // per name: the lowest stage holding it
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(lines);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> f;
    for (size_t at = 0;;) {
      const size_t tab = line.find('\t', at);
      f.push_back(line.substr(at, tab == std::string::npos ? std::string::npos : tab - at));
      if (tab == std::string::npos) break;
      at = tab + 1;
    }
    if (f.size() != 8) throw std::logic_error("checkpoint index line: " + line);
    const int stage = std::stoi(f[0]);
    if (auto [it, added] = lowest.emplace(f[2], stage); !added) it->second = std::min(it->second, stage);
    rows.push_back(std::move(f));
  }
  for (const std::vector<std::string>& f : rows) {
    if (std::stoi(f[0]) != lowest.at(f[2])) continue;
    Json& entry = index[f[2]];
    std::vector<int64_t> shape;
    for (size_t at = 0; at < f[7].size();) {
      const size_t comma = std::min(f[7].find(',', at), f[7].size());
      shape.push_back(std::stoll(f[7].substr(at, comma - at)));
      at = comma + 1;
    }
    entry["shape"] = shape;
    const int64_t moment = std::stoll(f[4]);
    if (moment < 0) {
      entry["file"] = f[1];
      entry["dataset"] = f[3];
      continue;
    }
    if (!entry.contains("state")) entry["state"] = Json::array();
    entry["state"].push_back({{"file", f[1]},
                              {"dataset", f[3]},
                              {"moment", moment},
                              {"offset", std::stoll(f[5])},
                              {"numel", std::stoll(f[6])}});
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
  if (read_attr<int64_t>(file, "node_begin") != stage.config().begin ||
      read_attr<int64_t>(file, "node_end") != stage.config().end)
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

}  // namespace

namespace {

// Whether `path` holds this stage as the run's plan cuts it (same stage count and node range).
bool same_split(const std::string& path, PipelineStage& stage, const CheckpointIdentity& id) {
  if (H5Fis_hdf5(path.c_str()) <= 0) return false;
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, "open " + path);
  return has_attr(file, "stages") && read_attr<int64_t>(file, "stages") == id.stages &&
         read_attr<int64_t>(file, "node_begin") == stage.config().begin &&
         read_attr<int64_t>(file, "node_end") == stage.config().end;
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
  at::NoGradGuard no_grad;
  auto& ps = stage.module().parameters();
  for (StageParameter& p : ps) {
    if (!index.contains(p.name))
      throw ConfigError("checkpoint " + where + " holds no parameter " + p.name + " (a checkpoint of another model?)");
    const Json& entry = index[p.name];
    if (entry["shape"].get<std::vector<int64_t>>() != p.tensor.sizes().vec())
      throw ConfigError("checkpoint " + where + " holds " + p.name + " with shape " + entry["shape"].dump() +
                        ", this model's is " + Json(p.tensor.sizes().vec()).dump());
    at::Tensor host = at::empty(p.tensor.sizes(), at::kFloat);
    read(entry, host.numel(), 0, host.data_ptr<float>(), host.numel());
    p.tensor.copy_(host);
  }
  const std::vector<StateOwner> owners = state_owners(stage);
  std::vector<at::Tensor> s = stage.optimizer().state();
  for (size_t i = 0; i < s.size(); ++i) {
    const StateOwner& o = owners[i % owners.size()];
    const int64_t moment = static_cast<int64_t>(i / owners.size());
    const StageParameter& p = ps[o.param];
    const Json& entry = index[p.name];
    at::Tensor host = at::empty({o.numel}, at::kFloat);
    int64_t covered = 0;
    for (const Json& slice : entry.contains("state") ? entry["state"] : Json::array()) {
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

void read_checkpoint(const std::string& dir, int64_t step, PipelineStage& stage, const CheckpointIdentity& id) {
  const std::string path = stage_file(dir, step, stage.config().stage);
  const int replica = stage.zero_shard() ? stage.config().replica : 0;
  const std::string state_path = replica > 0 ? stage_file(dir, step, stage.config().stage, replica) : "";
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
