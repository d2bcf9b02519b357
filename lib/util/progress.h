#pragma once
// Training progress on rank 0: on a terminal one self-updating bar (step, loss, samples/s,
// ETA); otherwise (a log file, a batch job) one plain line per step that scripts can grep.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include "util/enum_names.h"

namespace dawnpiper {

enum class ProgressKind { Auto, Bar, Lines };  // --progress; by name: EnumNames below

class Progress {
 public:
  // Steps first_step .. steps - 1 will be reported. Output goes to `out` unless quiet. Auto
  // draws a bar on a terminal, except under an MPI launcher: mpirun hands every rank a
  // pseudo-terminal even when its own output goes to a file.
  Progress(int64_t first_step, int64_t steps, double samples_per_step, bool quiet,
           ProgressKind style = ProgressKind::Auto, std::FILE* out = stdout);
  // lr and grad_norm are shown where they are numbers (a NaN norm: async, which has none).
  void step(int64_t step, double loss, double lr = std::nan(""), double grad_norm = std::nan(""));
  // A line "validation step <n> loss <value>" (after the step it follows).
  void validation(int64_t step, double loss);
  // Ends the bar's line (terminal only).
  void finish();
  double samples_per_second() const;
  // Without the first reported step (warm-up: first allocations, pipeline fill, lazy
  // initialization); the overall rate when fewer than two steps were reported.
  double steady_samples_per_second() const;
  double last_loss() const { return last_loss_; }
  double last_step_seconds() const { return last_step_s_; }
  int64_t steps_reported() const { return done_; }

 private:
  using Clock = std::chrono::steady_clock;
  int64_t first_, steps_, done_ = 0;
  double samples_per_step_;
  bool quiet_, terminal_;
  std::FILE* out_;
  Clock::time_point start_, last_, first_done_;
  double last_loss_ = 0, last_step_s_ = 0;
};

template <>
struct EnumNames<ProgressKind> {
  static constexpr const char* what = "progress style";
  static constexpr std::array<std::pair<ProgressKind, const char*>, 3> table{
      {{ProgressKind::Auto, "auto"}, {ProgressKind::Bar, "bar"}, {ProgressKind::Lines, "lines"}}};
  static constexpr std::array<const char*, 3> meaning{"a bar on a terminal, lines in logs and under mpirun", "", ""};
};

}  // namespace dawnpiper
