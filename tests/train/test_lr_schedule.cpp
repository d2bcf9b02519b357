// Learning-rate schedules: transformers' factors at the steps where they change shape, and the
// bad values a user gives.
#include <catch2/catch.hpp>

#include <cmath>

#include "train/lr_schedule.h"
#include "util/error.h"

using namespace dawnpiper;

TEST_CASE("learning-rate schedules follow transformers' warmup and decay", "[train]") {
  LrSchedule s;
  s.warmup_steps = 4;
  s.total_steps = 14;
  // Warmup: 0 at step 0, linear to the peak at step W, whatever comes after.
  for (LrScheduleKind kind : {LrScheduleKind::Constant, LrScheduleKind::Cosine, LrScheduleKind::Linear}) {
    s.kind = kind;
    CHECK(scheduled_lr(1.0, s, 0) == 0.0);
    CHECK(scheduled_lr(1.0, s, 2) == Approx(0.5));
    CHECK(scheduled_lr(1.0, s, 4) == Approx(1.0));
  }
  s.kind = LrScheduleKind::Constant;
  CHECK(scheduled_lr(2.0, s, 13) == 2.0);
  s.kind = LrScheduleKind::Linear;
  CHECK(scheduled_lr(2.0, s, 9) == Approx(1.0));  // half way from step 4 to 14
  CHECK(scheduled_lr(2.0, s, 14) == Approx(0.0).margin(1e-15));
  s.kind = LrScheduleKind::Cosine;
  CHECK(scheduled_lr(2.0, s, 9) == Approx(1.0));
  CHECK(scheduled_lr(2.0, s, 6) == Approx(1.0 + std::cos(M_PI * 0.2)));
  s.min_lr = 0.5;  // the decay ends at the floor: factor * (1 - 0.25) + 0.25
  CHECK(scheduled_lr(2.0, s, 14) == Approx(0.5));
  CHECK(scheduled_lr(2.0, s, 9) == Approx(1.25));
  s.kind = LrScheduleKind::Linear;
  CHECK(scheduled_lr(2.0, s, 9) == Approx(1.25));
  s.warmup_steps = 0;  // no warmup: the peak at step 0
  CHECK(scheduled_lr(2.0, s, 0) == 2.0);
}

TEST_CASE("bad learning-rate schedules are refused with the option named", "[train]") {
  LrSchedule s;
  s.kind = LrScheduleKind::Cosine;
  s.warmup_steps = -1;
  CHECK_THROWS_WITH(check_lr_schedule(1.0, s), Catch::Contains("--warmup-steps"));
  s.warmup_steps = 0;
  s.min_lr = 2.0;
  CHECK_THROWS_WITH(check_lr_schedule(1.0, s), Catch::Contains("--min-lr"));
  s.kind = LrScheduleKind::Constant;
  s.min_lr = 0.1;
  CHECK_THROWS_WITH(check_lr_schedule(1.0, s), Catch::Contains("constant schedule"));
  CHECK_THROWS_AS(from_name<LrScheduleKind>("cosine-annealing"), ConfigError);
  CHECK(from_name<LrScheduleKind>("linear") == LrScheduleKind::Linear);
}
