#include "run/resume.h"

#include <cstdio>
#include <fstream>

#include "runtime/checkpoint.h"
#include "runtime/mpi_wait.h"
#include "util/error.h"
#include "util/files.h"

namespace dawnpiper {

std::string sample_shape(const OpGraph& graph) {
  std::string shape;
  for (const Node& n : graph.nodes) {
    if (n.kind != OpKind::Input || !n.inputs.empty()) continue;
    for (int t : n.outputs) {
      Shape dims = graph.tensor(t).shape;
      if (!dims.empty() && dims.front() == graph.micro_batch_size) dims.erase(dims.begin());
      shape += (shape.empty() ? "" : ", ") + (n.role.empty() ? n.name : n.role) + " " + shape_str(dims);
    }
  }
  return shape;
}

Json run_identity(const OpGraph& graph, const TrainOptions& o, bool with_training) {
  Json j;
  j["model"] = graph.fingerprint();
  j["sample"] = sample_shape(graph);
  j["micro-batch-size"] = o.micro_batch_size;
  j["seed"] = o.config.seed;
  j["data"] = o.config.data.path;
  j["validation-fraction"] = o.config.data.validation_fraction;
  if (!with_training) return j;
  const OptimizerConfig& opt = o.config.optimizer;
  j["micro-batches"] = o.config.micro_batches;
  j["data-order"] = o.config.data.sequential ? "sequential" : "shuffled";
  j["optimizer"] = name_of(opt.kind);
  j["lr"] = opt.lr;
  if (opt.kind == OptimizerKind::Sgd) j["momentum"] = opt.momentum;
  j["weight-decay"] = opt.weight_decay;
  j["lr-schedule"] = name_of(opt.schedule.kind);
  j["warmup-steps"] = opt.schedule.warmup_steps;
  j["min-lr"] = opt.schedule.min_lr;
  j["grad-clip"] = opt.grad_clip;
  if (opt.schedule.kind != LrScheduleKind::Constant) j["steps"] = o.config.steps;
  // The checkpoint's layout (check_layout): how the stages' optimizer state is sharded.
  j["zero-stage"] = o.plan.zero_stage;
  j["data-parallel"] = o.plan.data_parallel;
  return j;
}

namespace {

// A sharded checkpoint (--zero-stage above 0) written before checkpoints had an index holds each
// replica's shard of the optimizer state with nothing saying where its slices lie: it resumes
// only at its own level and replica count, --resume-override or not. One with an index
// (checkpoint_moves), and any at level 0, moves to another level and replica count.
void check_layout(const Json& saved, const Json& now, const std::string& dir, int64_t step) {
  if (checkpoint_moves(dir, step)) return;
  const auto value = [](const Json& j, const char* key, int otherwise) {
    return j.contains(key) ? j[key].get<int>() : otherwise;
  };
  const int saved_level = value(saved, "zero-stage", 0), level = value(now, "zero-stage", 0);
  const int saved_replicas = value(saved, "data-parallel", 1), replicas = value(now, "data-parallel", 1);
  if ((saved_level == 0 && level == 0) || (saved_level == level && saved_replicas == replicas)) return;
  throw ConfigError("the checkpoint in " + dir + " was written at --zero-stage " + std::to_string(saved_level) +
                    " with --data-parallel " + std::to_string(saved_replicas) + ", and this run has --zero-stage " +
                    std::to_string(level) + " with --data-parallel " + std::to_string(replicas) +
                    ": a sharded checkpoint written before checkpoints had an index resumes only in the layout it "
                    "was written in");
}

// Compared by what they make together, the global batch (global_batch_change), or by the
// layout (check_layout); a new plan follows them (run/agreed_plan.h).
bool is_layout(const std::string& key, bool training) {
  return key == "zero-stage" || key == "data-parallel" ||
         (training && (key == "micro-batch-size" || key == "micro-batches"));
}

int64_t global_batch(const Json& run) {
  return run.value("micro-batch-size", int64_t{1}) * run.value("micro-batches", int64_t{1}) *
         run.value("data-parallel", int64_t{1});
}

std::string batch_parts(const Json& run) {
  return std::to_string(run.value("micro-batch-size", int64_t{1})) + " x " +
         std::to_string(run.value("micro-batches", int64_t{1})) + " x " +
         std::to_string(run.value("data-parallel", int64_t{1}));
}

// The global batch (micro-batch size x micro-batches x replicas) the checkpoint's run trained
// with and this one's, where they differ, with how the data goes on: step k reads the samples
// from k x the global batch on, so a larger batch skips samples and a smaller one reads some
// again. "" where they agree.
std::string global_batch_change(const Json& saved, const Json& now, int64_t step) {
  if (!saved.contains("micro-batches") || !now.contains("micro-batches")) return "";
  const int64_t was = global_batch(saved), is = global_batch(now);
  if (was == is) return "";
  const int64_t read = step * was, next = step * is;
  std::string data = "the data goes on by step: step " + std::to_string(step) + " reads from sample " +
                     std::to_string(next) + ", where the checkpoint's run had read " + std::to_string(read);
  if (next > read) data += " (samples " + std::to_string(read) + " to " + std::to_string(next - 1) + " are skipped)";
  if (next < read) data += " (samples " + std::to_string(next) + " to " + std::to_string(read - 1) + " are read again)";
  return "the global batch (micro-batch size x micro-batches x replicas) " + std::to_string(was) + " (" +
         batch_parts(saved) + ") -> " + std::to_string(is) + " (" + batch_parts(now) + "); " + data;
}

}  // namespace

void agreed_on_rank0(const std::function<void()>& check, int rank) {
  std::string problem;
  if (rank == 0) try {
      check();
    } catch (const ConfigError& e) {
      problem = "!" + e.reason();
    }
  broadcast_string_quietly(problem, 0, MPI_COMM_WORLD);
  if (!problem.empty()) throw ConfigError(problem.substr(1));
}

int64_t agreed_resume_step(const std::string& dir, int64_t requested, int rank) {
  int64_t step = -1;
  agreed_on_rank0([&] { step = checked_resume_step(dir, requested); }, rank);
  broadcast_quietly(&step, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  return step;
}

std::optional<Json> saved_run(const TrainOptions& o) {
  const std::string path = o.checkpoint_dir + "/run.json";
  if (!std::ifstream(path).good()) return std::nullopt;
  return read_json(path, [&] { return Json::parse(read_text_file(path)); });
}

void check_resumed_run(const OpGraph& graph, const TrainOptions& o, int64_t step) {
  const std::optional<Json> found = saved_run(o);
  if (!found) return;
  const Json& saved = *found;
  const bool training = !o.eval_only;
  const Json now = run_identity(graph, o, training);
  // Another model's checkpoint cannot be read, overridden or not: named by its first tensor.
  if (saved.contains("model") && saved["model"] != now["model"]) {
    std::vector<std::pair<std::string, std::vector<int64_t>>> params;
    for (const Node& n : graph.nodes)
      for (const ParamSpec& p : n.params)
        if (!p.tied()) params.push_back({p.source.empty() ? n.name + "." + p.name : p.source, p.shape});
    if (const std::string mismatch = checkpoint_parameter_mismatch(o.checkpoint_dir, step, params); !mismatch.empty())
      throw ConfigError("--resume: the checkpoint in " + o.checkpoint_dir + " is of another model: " + mismatch +
                        " (another --model, --model-file or model option than the run that wrote it?)");
  }
  if (now.contains("zero-stage")) check_layout(saved, now, o.checkpoint_dir, step);
  std::string changes;
  for (const auto& [key, value] : now.items())
    if (saved.contains(key) && saved[key] != value && !is_layout(key, training))
      changes += (changes.empty() ? "" : ", ") +
                 (key == "sample" ? "the sample (--seq-len, --image-size) " : "--" + key + " ") + saved[key].dump() +
                 " -> " + value.dump();
  // The checkpoint holds its optimizer's state, which another optimizer cannot take, overridden
  // or not.
  if (training && saved.contains("optimizer") && saved["optimizer"] != now["optimizer"])
    throw ConfigError("the checkpoint in " + o.checkpoint_dir + " holds the state of --optimizer " +
                      saved["optimizer"].get<std::string>() + ", and this run has --optimizer " +
                      now["optimizer"].get<std::string>() +
                      ": repeat it, or start the other optimizer from the checkpoint's weights (dawnpiper "
                      "export-weights, then --init-from)");
  if (training)
    if (const std::string batch = global_batch_change(saved, now, step); !batch.empty())
      changes += (changes.empty() ? "" : ", ") + batch;
  if (changes.empty()) return;
  if (!o.resume_override)
    throw ConfigError("--resume continues the run in " + o.checkpoint_dir + ", and this one changes " + changes +
                      ": repeat its values, or give --resume-override to change them");
  std::printf("  note: --resume-override: %s\n", changes.c_str());
}

}  // namespace dawnpiper
