#include "train/metrics_log.h"

#include <cerrno>
#include <cstring>

#include "util/error.h"
#include "util/json.h"

namespace dawnpiper {

MetricsLog::MetricsLog(const std::string& path, bool append) {
  if (path.empty()) return;
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!file_) throw ConfigError("--metrics-out " + path + ": " + std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::write(const std::string& line) {
  if (!file_) return;
  std::fputs((line + "\n").c_str(), file_);
  std::fflush(file_);
}

void MetricsLog::step(const StepMetrics& m) {
  Json j;
  j["kind"] = "train";
  j["step"] = m.step;
  j["loss"] = m.loss;
  j["lr"] = m.lr;
  j["grad_norm"] = m.grad_norm;  // NaN: null
  j["step_s"] = m.step_s;
  j["samples_per_s"] = m.samples_per_s;
  if (m.tokens_per_s > 0) j["tokens_per_s"] = m.tokens_per_s;
  if (m.model_flops_per_s > 0) j["model_flops_per_s"] = m.model_flops_per_s;
  if (m.mfu > 0) j["mfu"] = m.mfu;
  if (!m.peak_bytes.empty()) j["peak_bytes"] = m.peak_bytes;
  write(j.dump());
}

void MetricsLog::validation(int64_t step, double loss) {
  Json j;
  j["kind"] = "validation";
  j["step"] = step;
  j["loss"] = loss;
  write(j.dump());
}

int64_t tokens_per_sample(const OpGraph& graph) {
  for (const Node& n : graph.nodes) {
    if (n.kind != OpKind::Input || (n.role != "tokens" && n.role != "mlm_tokens")) continue;
    const std::vector<int64_t>& shape = graph.tensor(n.outputs[0]).shape;
    int64_t tokens = 1;
    for (size_t d = 1; d < shape.size(); ++d) tokens *= shape[d];
    return tokens;
  }
  return 0;
}

}  // namespace dawnpiper
