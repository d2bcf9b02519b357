#include "run/resume.h"

#include <cstdio>
#include <fstream>

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
  return j;
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
  std::string changes;
  for (const auto& [key, value] : now.items())
    if (saved.contains(key) && saved[key] != value)
      changes += (changes.empty() ? "--" : ", --") + key + " " + saved[key].dump() + " -> " + value.dump();
  if (changes.empty()) return;
  if (!o.resume_override)
    throw ConfigError("--resume continues the run in " + o.checkpoint_dir + ", and this one changes " + changes +
                      ": repeat its values, or give --resume-override to change them");
  std::printf("  note: --resume-override: %s\n", changes.c_str());
}

}  // namespace dawnpiper
