#pragma once
// --metrics-out: one JSON object per line for every finished step and every validation, written
// and flushed as they happen, so a plot (scripts/plot_metrics.py) or `tail -f` reads a running
// job. A resumed run appends to its file (a step repeated after an interruption: the later line
// is the one trained on). LibTorch-free.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "graph/op_graph.h"

namespace dawnpiper {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0, lr = 0;
  double grad_norm = 0;  // NaN: not computed (async), written as null
  double step_s = 0;     // wall time since the previous report
  double samples_per_s = 0, tokens_per_s = 0;
  double model_flops_per_s = 0;     // the graph's forward and backward FLOPs per second
  double mfu = 0;                   // model_flops_per_s over the peak of the GPUs the run uses; 0: unknown
  std::vector<int64_t> peak_bytes;  // per stage during the step (empty: not measured)
};

class MetricsLog {
 public:
  // Empty path: writes nothing. Throws ConfigError when the file cannot be opened.
  MetricsLog(const std::string& path, bool append);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void step(const StepMetrics& m);
  void validation(int64_t step, double loss);

 private:
  void write(const std::string& line);
  std::FILE* file_ = nullptr;
};

// Tokens in one sample: the sequence length of the graph's token input (0 for a model without one,
// an image model).
int64_t tokens_per_sample(const OpGraph& graph);

}  // namespace dawnpiper
