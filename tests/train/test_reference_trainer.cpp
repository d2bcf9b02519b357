// The reference trainer: loss decreases on every tiny preset, both optimizers, NaN detection.
#include "torch_test.h"

#include "memory/counting_allocator.h"
#include "models/model_config.h"
#include "train/reference_trainer.h"
#include "util/error.h"

using namespace dawnpiper;

namespace {
double mean(const std::vector<StepResult>& r, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to; ++i) s += r[i].loss;
  return s / static_cast<double>(to - from);
}
}  // namespace

TEST_CASE("loss decreases over 20 steps on every tiny preset", "[train]") {
  at::set_num_threads(1);
  for (const std::string& preset : preset_names()) {
    if (preset.find("-tiny") == std::string::npos) continue;
    const ModelConfig config = preset_config(preset);
    const bool conv = config.family == ModelFamily::AmoebaNet;
    for (OptimizerKind optimizer : {OptimizerKind::Sgd, OptimizerKind::Adam}) {
      INFO(preset << " " << optimizer);
      OpGraph g = build_model(config, 4);
      TrainConfig c;
      c.steps = 20;
      c.micro_batches = 2;
      c.optimizer.kind = optimizer;
      const bool adam = optimizer == OptimizerKind::Adam;
      c.optimizer.lr = adam ? (conv ? 1e-3 : 3e-3) : (conv ? 3e-3 : 0.05);
      ReferenceTrainer t(g, c);
      auto r = t.run();
      REQUIRE(r.size() == 20);
      // The last five steps' mean loss is at least 5% below the first five's.
      CHECK(mean(r, 15, 20) < 0.95 * mean(r, 0, 5));
    }
  }
}

TEST_CASE("training is deterministic for a seed", "[train]") {
  OpGraph g = build_model(preset_config("bert-tiny"), 2);
  TrainConfig c;
  c.steps = 3;
  c.micro_batches = 2;
  auto a = ReferenceTrainer(g, c).run();
  auto b = ReferenceTrainer(g, c).run();
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i].loss == b[i].loss);
}

TEST_CASE("a diverging run reports the step of the non-finite loss", "[train]") {
  OpGraph g = build_model(preset_config("mlp-tiny"), 4);
  TrainConfig c;
  c.steps = 50;
  c.optimizer.lr = 1e6;
  ReferenceTrainer t(g, c);
  try {
    t.run();
    FAIL("expected a non-finite loss");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("at step") != std::string::npos);
  }
}

TEST_CASE("the trainer's measured peak respects a capacity, or fails with the OOM error", "[train]") {
  CountingAllocator& a = CountingAllocator::install();
  OpGraph g = build_model(preset_config("gpt2-tiny"), 4);
  TrainConfig c;
  c.steps = 1;
  a.set_capacity(kUnlimitedBytes);
  ReferenceTrainer free_run(g, c);
  StepResult r = free_run.step();
  REQUIRE(r.peak_bytes > 0);
  a.set_capacity(a.live_bytes() + (r.peak_bytes - a.live_bytes()) / 4);
  CHECK_THROWS_AS(ReferenceTrainer(g, c).step(), OutOfMemoryError);
  a.set_capacity(kUnlimitedBytes);
}
