// The stage memory replay's shortcuts: a synchronous step's second pass (the steady state) is
// derived from the first instead of walked, and a micro-batch's forward (or backward) is walked
// once and repeated for the others. They must give what walking everything gives (the replay
// does when it records events) on zoo models' stages, with and without evictions.
#include <catch2/catch.hpp>

#include <random>

#include "models/model_config.h"
#include "models/model_source.h"
#include "plan/cost_model.h"
#include "plan/memory_optimizer.h"
#include "plan/stage_memory.h"
#include "plan/stage_program.h"
#include "profile/analytic.h"

using namespace dawnpiper;

TEST_CASE("the replay's shortcuts give what walking every pass and micro-batch gives", "[plan][replay]") {
  const DeviceSpec spec = device_spec("a100-40gb");
  std::mt19937_64 rng(7);
  int compared = 0, evicting = 0;
  for (const char* preset : {"gpt2-tiny", "bert-tiny", "t5-tiny"}) {
    const Profile p = analytic_profile_model(ModelSource(preset_config(preset)), {1, 2}, spec).at_batch(3);
    for (ScheduleKind schedule : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Async}) {
      for (OptimizerKind optimizer : {OptimizerKind::Sgd, OptimizerKind::Adam}) {
        PlanOptions o;
        o.stages = 3;
        o.micro_batches = 4;
        o.schedule = schedule;
        o.optimizer = optimizer;
        const CostModel model(p, o);
        for (int trial = 0; trial < 12; ++trial) {
          const int b = std::uniform_int_distribution<int>(0, model.size() - 2)(rng);
          const int e = trial % 3 == 0 ? model.size() : std::uniform_int_distribution<int>(b + 1, model.size())(rng);
          const int x = b == 0 ? 0 : e == model.size() ? 2 : 1;
          const int64_t open = replay_stage_memory(model, b, e, x, {}).peak;
          // Evict down to a random share of the open peak (nothing, when it already fits).
          const double share = std::uniform_real_distribution<double>(0.3, 1.1)(rng);
          MemoryOptimizer optimizer_pass(model, MemoptMode::SwapRecompute, static_cast<int64_t>(share * open));
          const StageMemopt m = optimizer_pass.optimize(b, e, x, /*with_decisions=*/true);
          evicting += m.swapped + m.recomputed > 0;
          INFO(preset << " " << schedule_kind_name(schedule) << " [" << b << "," << e << ") stage " << x << " share "
                      << share);
          const StageMemoryReplay derived = replay_stage_memory(model, b, e, x, m.decisions);
          std::vector<Action> events;  // recording events walks both passes
          const StageMemoryReplay walked =
              replay_stage_program(model, stage_program(model, b, e, x, m.decisions), &events);
          CHECK(derived.peak == walked.peak);
          CHECK(derived.peak_action == walked.peak_action);
          CHECK(derived.peak_node == walked.peak_node);
          CHECK(derived.first_forward_end == walked.first_forward_end);
          ++compared;
        }
      }
    }
  }
  CHECK(compared == 3 * 3 * 2 * 12);
  CHECK(evicting > compared / 3);  // most comparisons replay swaps or recomputations
}
