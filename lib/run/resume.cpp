#include "run/resume.h"

#include <cstdio>
#include <fstream>

#include "runtime/checkpoint.h"
#include "runtime/mpi_wait.h"
#include "util/error.h"
#include "util/files.h"

namespace dawnpiper {

Json run_identity(const OpGraph& graph, const TrainOptions& o, bool with_training) {
  Json j;
  j["model"] = graph.fingerprint();
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
  j["zero-stage"] = o.zero_stage;
  j["data-parallel"] = o.data_parallel;
  return j;
}

namespace {

// A sharded checkpoint (--zero-stage above 0) holds each replica's shard of the optimizer
// state: it resumes only at its own level and replica count, --resume-override or not (until
// checkpoints can move between layouts). At level 0 the replica count may change as before.
void check_layout(const Json& saved, const Json& now, const std::string& dir) {
  const auto value = [](const Json& j, const char* key, int otherwise) {
    return j.contains(key) ? j[key].get<int>() : otherwise;
  };
  const int saved_level = value(saved, "zero-stage", 0), level = value(now, "zero-stage", 0);
  const int saved_replicas = value(saved, "data-parallel", 1), replicas = value(now, "data-parallel", 1);
  if ((saved_level == 0 && level == 0) || (saved_level == level && saved_replicas == replicas)) return;
  throw ConfigError("the checkpoint in " + dir + " was written at --zero-stage " + std::to_string(saved_level) +
                    " with --data-parallel " + std::to_string(saved_replicas) + ", and this run has --zero-stage " +
                    std::to_string(level) + " with --data-parallel " + std::to_string(replicas) +
                    ": a sharded checkpoint resumes only in the layout it was written in");
}

bool is_layout(const std::string& key) { return key == "zero-stage" || key == "data-parallel"; }

}  // namespace

int64_t agreed_resume_step(const std::string& dir, int64_t requested, int rank) {
  std::string answer;  // the step, or "!" and what is wrong
  if (rank == 0) try {
      answer = std::to_string(checked_resume_step(dir, requested));
    } catch (const ConfigError& e) {
      answer = "!" + e.reason();
    }
  broadcast_string_quietly(answer, 0, MPI_COMM_WORLD);
  if (!answer.empty() && answer[0] == '!') throw ConfigError(answer.substr(1));
  return std::stoll(answer);
}

std::optional<Json> saved_run(const TrainOptions& o) {
  const std::string path = o.checkpoint_dir + "/run.json";
  if (!std::ifstream(path).good()) return std::nullopt;
  return read_json(path, [&] { return Json::parse(read_text_file(path)); });
}

void check_resumed_run(const OpGraph& graph, const TrainOptions& o) {
  const std::optional<Json> found = saved_run(o);
  if (!found) return;
  const Json& saved = *found;
  const Json now = run_identity(graph, o, !o.eval_only);
  if (now.contains("zero-stage")) check_layout(saved, now, o.checkpoint_dir);
  std::string changes;
  for (const auto& [key, value] : now.items())
    if (saved.contains(key) && saved[key] != value && !is_layout(key))
      changes += (changes.empty() ? "--" : ", --") + key + " " + saved[key].dump() + " -> " + value.dump();
  if (changes.empty()) return;
  if (!o.resume_override)
    throw ConfigError("--resume continues the run in " + o.checkpoint_dir + ", and this one changes " + changes +
                      ": repeat its values, or give --resume-override to change them");
  std::printf("  note: --resume-override: %s\n", changes.c_str());
}

}  // namespace dawnpiper
