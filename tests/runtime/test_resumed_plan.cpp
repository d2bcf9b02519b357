// A resumed run keeps its checkpoint's plan only where that plan still serves it
// (run/agreed_plan.h): a plan predicted to peak above the memory a rank may fill now, a GPU's
// free memory that the command line did not give, is planned anew, as is one made for another
// --device-memory.
#include "torch_test.h"

#include "run/agreed_plan.h"

using namespace dawnpiper;

TEST_CASE("a resumed run's saved plan serves only while its peaks fit the memory", "[run][resume]") {
  TrainOptions o;
  o.micro_batch_size = 4;
  Plan saved;
  saved.micro_batch_size = o.micro_batch_size;
  saved.options.stages = 1;
  saved.options.micro_batches = o.config.micro_batches;
  saved.options.optimizer = o.config.optimizer.kind;
  saved.stages.resize(1);
  saved.stages[0].memory.replayed_peak = int64_t{5} << 20;
  const OpGraph graph;
  const RankLayout layout;
  const c10::Device cpu(c10::kCPU);
  CHECK(resumed_plan_changes(saved, graph, o, layout, cpu).empty());
  // The memory from the device (a GPU's free memory), below the plan's peak: planned anew.
  o.capacity = int64_t{4} << 20;
  o.capacity_source = "the GPU's free memory";
  CHECK(resumed_plan_changes(saved, graph, o, layout, cpu) ==
        "its predicted peak 5.00 MiB is above the 4.00 MiB a rank may fill now (the GPU's free memory)");
  o.capacity = int64_t{6} << 20;  // above it: the plan serves
  CHECK(resumed_plan_changes(saved, graph, o, layout, cpu).empty());
  // Given with --device-memory, another memory than the plan's is a change whatever the peak.
  o.capacity_source = "--device-memory";
  CHECK(resumed_plan_changes(saved, graph, o, layout, cpu) == "--device-memory unlimited -> 6.00 MiB");
}
