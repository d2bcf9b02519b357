#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <ostream>

#include "util/error.h"

namespace dawnpiper {

double scheduled_lr(double lr, const LrSchedule& s, int64_t step) {
  const double warmup = static_cast<double>(std::max<int64_t>(1, s.warmup_steps));
  if (step < s.warmup_steps) return lr * static_cast<double>(step) / warmup;
  if (s.kind == LrScheduleKind::Constant) return lr;
  const double progress = static_cast<double>(step - s.warmup_steps) /
                          static_cast<double>(std::max<int64_t>(1, s.total_steps - s.warmup_steps));
  const double decay =
      s.kind == LrScheduleKind::Cosine ? 0.5 * (1.0 + std::cos(M_PI * progress)) : std::max(0.0, 1.0 - progress);
  const double floor = s.min_lr / lr;  // transformers' min_lr_rate
  return lr * std::max(0.0, decay * (1.0 - floor) + floor);
}

void check_lr_schedule(double lr, const LrSchedule& s) {
  if (s.warmup_steps < 0) throw ConfigError("--warmup-steps must not be negative");
  if (s.min_lr < 0 || s.min_lr > lr)
    throw ConfigError("--min-lr " + std::to_string(s.min_lr) + " must be in [0, --lr " + std::to_string(lr) + "]");
  if (s.kind == LrScheduleKind::Constant && s.min_lr > 0)
    throw ConfigError("--min-lr is where --lr-schedule cosine or linear ends; a constant schedule has none");
}

}  // namespace dawnpiper
