#include "runtime/checkpoint.h"

#include <ATen/core/grad_mode.h>

#include <fstream>
#include <optional>

#include "runtime/mpi_wait.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/files.h"
#include "util/hdf5_io.h"

namespace dawnpiper {

using namespace h5;

namespace {

std::string step_dir(const std::string& dir, int64_t step) { return dir + "/step-" + std::to_string(step); }
std::string stage_file(const std::string& dir, int64_t step, int stage, int replica = 0) {
  return step_dir(dir, step) + "/stage-" + std::to_string(stage) +
         (replica > 0 ? "-replica-" + std::to_string(replica) : std::string()) + ".h5";
}

// The sharding a stage's optimizer state has: ZeRO's level and replica count, or 0 and 1.
std::pair<int64_t, int64_t> sharding_of(PipelineStage& stage) {
  if (!stage.zero_shard()) return {0, stage.config().replicas};
  return {1, stage.config().replicas};
}

void write_tensor(hid_t group, const std::string& name, const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kCPU).contiguous();
  if (c.scalar_type() != at::kFloat) throw std::logic_error("checkpoint: only float32 tensors are supported");
  write_floats(group, name, c.data_ptr<float>(), static_cast<size_t>(c.numel()));
}

}  // namespace

namespace {

void write_stage_file(const std::string& dir, int64_t next_step, PipelineStage& stage, const CheckpointIdentity& id) {
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
      for (size_t i = 0; i < stage.module().parameters().size(); ++i) {
        const StageParameter& p = stage.module().parameters()[i];
        write_tensor(params, std::to_string(i), p.tensor);
        names.push_back(p.name);
      }
      write_strings(params, "names", names);
    }
    Handle state(H5Gcreate2(file, "optimizer_state", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose, "create group");
    const std::vector<at::Tensor> s = stage.optimizer().state();
    for (size_t i = 0; i < s.size(); ++i)
      if (s[i].defined()) write_tensor(state, std::to_string(i), s[i]);
  });
}

}  // namespace

void write_checkpoint(const std::string& dir, int64_t next_step, const std::vector<PipelineStage*>& stages,
                      const CheckpointIdentity& id, MPI_Comm comm, MPI_Comm replicas) {
  int rank = 0, replica = 0;
  MPI_Comm_rank(comm, &rank);
  if (replicas != MPI_COMM_NULL) MPI_Comm_rank(replicas, &replica);
  make_directories(step_dir(dir, next_step));
  for (PipelineStage* stage : stages) write_stage_file(dir, next_step, *stage, id);
  // Every stage has its file once all reach the barrier (of every replica's pipeline, then of
  // each stage's replicas); then `latest` may move.
  barrier_quietly(comm);
  if (replicas != MPI_COMM_NULL) barrier_quietly(replicas);
  if (rank == 0 && replica == 0) {
    write_text_atomically(dir + "/latest", std::to_string(next_step) + "\n");
    for (const std::string& name : list_directory(dir))
      if (name.rfind("step-", 0) == 0 && name != "step-" + std::to_string(next_step)) remove_tree(dir + "/" + name);
  }
}

int64_t latest_checkpoint(const std::string& dir) {
  std::ifstream in(dir + "/latest");
  int64_t step = -1;
  if (!(in >> step) || step < 0)
    throw ConfigError("--resume: no complete checkpoint in '" + dir + "' (no readable '" + dir + "/latest')");
  return step;
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

void read_checkpoint(const std::string& dir, int64_t step, PipelineStage& stage, const CheckpointIdentity& id) {
  const std::string path = stage_file(dir, step, stage.config().stage);
  const int replica = stage.zero_shard() ? stage.config().replica : 0;
  const std::string state_path = replica > 0 ? stage_file(dir, step, stage.config().stage, replica) : "";
  quiet_errors();
  if (H5Fis_hdf5(path.c_str()) <= 0) throw ConfigError("checkpoint file '" + path + "' is missing or unreadable");
  try {
    read_stage_file(path, stage, id, state_path);
  } catch (const Error&) {
    throw;
  } catch (const std::runtime_error& e) {  // HDF5 or a dataset of the wrong size: a damaged file
    throw ConfigError("checkpoint file '" + path + "' is truncated or corrupt (" + e.what() +
                      "); to resume from an earlier step, write its number into " + dir +
                      "/latest, or start without --resume");
  }
}

}  // namespace dawnpiper
