// The options a plan fixes (cli/options.h: planned_options): every planning option has its line,
// `train --plan-in` takes a plan's values or refuses a given one that contradicts them, and a
// resumed run takes only what it may.
#include <set>
#include <string>
#include <vector>

#include "cli/train_options.h"
#include "torch_test.h"

using namespace dawnpiper;

namespace {

po::variables_map parsed(const std::vector<std::string>& args) {
  std::vector<const char*> argv{"train"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  po::variables_map vm;
  po::store(po::parse_command_line(static_cast<int>(argv.size()), argv.data(), train_options()), vm);
  po::notify(vm);
  return vm;
}

// Two ranks of two interleaved stages, two replicas at ZeRO level 2: nothing at its default.
Plan a_plan() {
  Plan plan;
  plan.options.schedule = ScheduleChoice::named("interleaved").with_virtual_stages(2);
  plan.options.stages = 4;
  plan.stages.resize(4);
  plan.options.micro_batches = 6;
  plan.options.optimizer = OptimizerKind::AdamW;
  plan.options.planner = PlannerKind::Even;
  plan.options.memopt = MemoptKind::Recompute;
  plan.options.data_parallel = 2;
  plan.options.zero_stage = 2;
  plan.options.bucket_bytes = int64_t{1} << 20;
  plan.micro_batch_size = 3;
  plan.precision = Precision::Bf16;
  return plan;
}

}  // namespace

TEST_CASE("every planning option is one a plan fixes", "[cli]") {
  std::set<std::string> fixed;
  for (const PlannedOption& o : planned_options()) fixed.insert(o.key);
  const po::options_description planning = planning_options();
  for (const auto& option : planning.options()) CHECK(fixed.count(option->long_name()) == 1);
  for (const char* key : {"micro-batches", "micro-batch-size", "precision"}) CHECK(fixed.count(key) == 1);
  // --planner's help comes from the enum's names: the pipeline planners, then the baselines.
  CHECK(planning.find("planner", false).description() ==
        "dawnpiper | gpipe | pipedream | vpipe | even | exact; `plan` also: zero2 | zero3 (ZeRO's data-parallel "
        "baseline)");
}

TEST_CASE("train --plan-in takes the plan's settings and refuses a given one that contradicts them", "[cli]") {
  const Plan plan = a_plan();
  po::variables_map vm = parsed({});
  adopt_plan_settings(plan, vm);
  const PlannedRun taken{plan_request_from(vm), vm["micro-batch-size"].as<int64_t>(), vm["precision"].as<Precision>()};
  CHECK(taken.request.ranks == 2);
  CHECK(taken.request.schedule.virtual_stages() == 2);
  CHECK(taken.request.bucket_bytes == plan.options.bucket_bytes);
  for (const PlannedOption& o : planned_options()) CHECK(o.compared(taken) == o.compared(planned_run(plan)));

  // Given values that agree (auto admits the plan's schedule; a size by its bytes) stay.
  vm = parsed({"--schedule", "auto", "--micro-batches", "6", "--bucket-size", "1MiB"});
  CHECK_NOTHROW(adopt_plan_settings(plan, vm));
  vm = parsed({"--bucket-size", "2MiB"});
  CHECK_THROWS_WITH(
      adopt_plan_settings(plan, vm),
      Catch::Contains(
          "--bucket-size 2MiB contradicts the plan (--plan-in), made for 1048576 bytes; leave the option out "
          "or plan again"));
  vm = parsed({"--optimizer", "sgd"});
  CHECK_THROWS_WITH(adopt_plan_settings(plan, vm), Catch::Contains("--optimizer sgd contradicts the plan (--plan-in), "
                                                                   "made for adamw"));
}

TEST_CASE("a resumed run takes its checkpoint plan's schedule and micro-batching where none is given", "[cli]") {
  const Plan plan = a_plan();
  po::variables_map vm = parsed({"--micro-batches", "8"});
  adopt_plan_settings(plan, vm, /*resumed=*/true);
  CHECK(vm["schedule"].as<ScheduleRequest>().name() == "interleaved");
  CHECK(vm["virtual-stages"].as<int>() == 2);
  CHECK(vm["micro-batches"].as<int64_t>() == 8);  // given: kept, and the run plans anew
  CHECK(vm["micro-batch-size"].as<int64_t>() == 3);
  CHECK(vm["optimizer"].as<OptimizerKind>() == OptimizerKind::Sgd);  // the checkpoint's run compares it
  // Another schedule keeps its own virtual stages.
  vm = parsed({"--schedule", "1f1b"});
  adopt_plan_settings(plan, vm, /*resumed=*/true);
  CHECK(vm["schedule"].as<ScheduleRequest>().name() == "1f1b");
  CHECK(vm["virtual-stages"].as<int>() == 0);
}
