#pragma once
// Learning-rate schedules: the rate of each training step, from the peak rate (--lr). The factors
// are transformers' (get_constant_schedule_with_warmup, get_linear_schedule_with_warmup,
// get_cosine_with_min_lr_schedule_with_warmup on torch's LambdaLR), so a run here and one there
// use the same rate at every step: warmup rises linearly from 0 at step 0 to the peak at step W,
// then the rate stays (constant) or decays to min_lr at the run's last step (linear, cosine).
// LibTorch-free.
#include <cstdint>
#include <iosfwd>
#include <string>
#include "util/enum_names.h"

namespace dawnpiper {

enum class LrScheduleKind { Constant, Cosine, Linear };
template <>
struct EnumNames<LrScheduleKind> {
  static constexpr const char* what = "learning-rate schedule";
  static constexpr std::array<std::pair<LrScheduleKind, const char*>, 3> table{
      {{LrScheduleKind::Constant, "constant"}, {LrScheduleKind::Cosine, "cosine"}, {LrScheduleKind::Linear, "linear"}}};
};

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::Constant;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // the run's steps: the decay ends there
  double min_lr = 0;        // where linear and cosine end
};

// The rate of step `step` (0-based) for peak rate `lr`.
double scheduled_lr(double lr, const LrSchedule& schedule, int64_t step);

// Throws ConfigError naming the option: negative warmup, min_lr outside [0, lr], min_lr with a
// constant schedule.
void check_lr_schedule(double lr, const LrSchedule& schedule);

}  // namespace dawnpiper
