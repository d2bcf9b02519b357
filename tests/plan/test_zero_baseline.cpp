// ZeRO's data-parallel baseline (plan/zero_baseline.h): the per-GPU terms by hand, how they
// scale with the GPUs, the batch order ZeRO-3 >= ZeRO-2 >= plain data parallelism where
// parameters dominate, the largest batch, and the pipeline planner's refusal.
#include <catch2/catch.hpp>

#include "models/model_config.h"
#include "models/model_source.h"
#include "plan/planner.h"
#include "plan/stage_memory.h"
#include "plan/zero_baseline.h"
#include "profile/analytic.h"
#include "synthetic_profile.h"
#include "util/error.h"
#include "util/units.h"

using namespace dawnpiper;
using namespace dawnpiper::testing;

namespace {

// input -> a (100,000 fp32 parameters: persistent under ZeRO-3) -> b (1e6) -> c (1e6) -> loss.
Profile four_nodes() {
  SyntheticOptions o;
  o.nodes = 5;
  Profile p = random_profile(3, o);
  p.nodes[1].param_bytes = 400000;
  p.nodes[2].param_bytes = 4000000;
  p.nodes[3].param_bytes = 4000000;
  p.nodes[4].param_bytes = 0;
  for (NodeProfile& n : p.nodes) n.param_grad_bytes = n.param_bytes;
  return p;
}

ZeroBaselineOptions small_buckets(int level, int gpus) {
  ZeroBaselineOptions o;
  o.level = level;
  o.data_parallel = gpus;
  o.optimizer = OptimizerKind::Sgd;  // one momentum buffer: 4 bytes a parameter, fp32
  o.config.reduce_bucket_elements = 1000;
  o.config.prefetch_bucket_elements = 500;
  return o;
}

// Parameters dominate: 30 nodes of 2-3 MB of parameters, 10-20 KB of activations a sample.
Profile parameter_heavy() {
  SyntheticOptions o;
  o.nodes = 30;
  o.param_min = 2000000;
  o.param_max = 3000000;
  o.bytes_min = 10000;
  o.bytes_max = 20000;
  o.workspace_max = 5000;
  return random_profile(11, o);
}

}  // namespace

TEST_CASE("ZeRO-2 and ZeRO-3 per GPU: every term by hand", "[plan][zero]") {
  const Profile p = four_nodes();
  // 8.4 MB of parameters = 2.1e6 fp32 elements; D = 4: a shard of 525,000 elements.
  const ZeroBaseline two = zero_baseline(p, small_buckets(2, 4));
  const ZeroMemory& m2 = two.memory;
  CHECK(m2.parameters == 8400000);  // every parameter
  CHECK(m2.gathered == 0);
  CHECK(m2.gradients == 525000 * 4);   // the partition, compute precision
  CHECK(m2.master == 525000 * 4);      // fp32 copy of the partition
  CHECK(m2.optimizer == 525000 * 4);   // SGD's momentum on it
  CHECK(m2.buckets == 1000 * 4);       // one reduce bucket (overlap_comm off below stage 3)
  CHECK(m2.transient == 4000000);      // the largest node's parameters' gradient
  CHECK(m2.step_extra == 525000 * 4);  // the flat fp32 gradient partition at the step
  CHECK(m2.activations > 0);
  CHECK(m2.peak() == 8400000 + 3 * 2100000 + 4000 + 4000000 + m2.activations);

  const ZeroBaseline three = zero_baseline(p, small_buckets(3, 4));
  const ZeroMemory& m3 = three.memory;
  CHECK(m3.parameters == 8000000 / 4 + 400000);  // node a (1e5 elements) stays whole
  CHECK(m3.gathered == (500 + 1000000) * 4);     // prefetch bucket + the largest node
  CHECK(m3.gradients == m2.gradients);
  CHECK(m3.master == m2.master);
  CHECK(m3.optimizer == m2.optimizer);
  CHECK(m3.buckets == 1000 * 4);  // one buffer, overlap or not
  CHECK(m3.transient == 4000000);
  CHECK(m3.step_extra == 1000 * 4);  // fp32: no copy of the partition; the bucket stays
  CHECK(m3.activations == m2.activations);
  CHECK(m3.peak() == 2400000 + 4002000 + 3 * 2100000 + 4000 + 4000000 + m3.activations);

  // Adam: two moments on the fp32 partition.
  ZeroBaselineOptions adam = small_buckets(2, 4);
  adam.optimizer = OptimizerKind::Adam;
  CHECK(zero_baseline(p, adam).memory.optimizer == 2 * 525000 * 4);
  // overlap_comm: two buckets at level 2.
  ZeroBaselineOptions overlap = small_buckets(2, 4);
  overlap.config.overlap_comm = 1;
  CHECK(zero_baseline(p, overlap).memory.buckets == 2 * 1000 * 4);
  // DeepSpeed's defaults: a 5e8-element reduce bucket, 2 GB in fp32.
  ZeroBaselineOptions defaults;
  defaults.data_parallel = 4;
  CHECK(zero_baseline(p, defaults).memory.buckets == int64_t{2000000000});

  // The collectives: the parameters' bytes twice (ZeRO-2) or three times (ZeRO-3), (D-1)/D of
  // them over the link.
  ZeroBaselineOptions link = small_buckets(2, 4);
  link.link_bandwidth = 1e9;
  CHECK(zero_baseline(p, link).collective_ms == Approx(1e3 * 2 * 0.75 * 8400000 / 1e9));
  link.level = 3;
  CHECK(zero_baseline(p, link).collective_ms == Approx(1e3 * 3 * 0.75 * 8400000 / 1e9));
  double compute = 0;
  for (const NodeProfile& n : p.nodes) compute += n.fwd_ms + n.bwd_ms;
  CHECK(two.compute_ms == Approx(compute));
  CHECK(two.global_batch() == 4 * p.micro_batch_size);
  // The update: each GPU's optimizer on its quarter, in the step.
  CHECK(two.update_ms == 0);  // the profile has no update times
  Profile timed = p;
  timed.update_ms = {8, 20, 16};
  const ZeroBaseline updated = zero_baseline(timed, link);
  CHECK(updated.update_ms == Approx(8.0 / 4));  // sgd
  CHECK(updated.step_ms() == Approx(updated.compute_ms + updated.collective_ms + 2));
}

TEST_CASE("ZeRO's activations are the one-stage replay's without the parameter state", "[plan][zero]") {
  const Profile p = four_nodes();
  const int64_t activations = zero_baseline(p, small_buckets(2, 4)).memory.activations;
  // The whole step replayed with every parameter, gradient and momentum holds them on top.
  const int64_t whole = replay_whole_step(p, OptimizerKind::Sgd).peak;
  CHECK(activations < whole);
  CHECK(activations >= whole - 3 * 8400000);
  // Plain data parallelism: the whole state and the replay's own peak, whose gradients appear
  // only in the backward (at most the flat sum).
  const ZeroMemory dp = zero_baseline(p, small_buckets(0, 4)).memory;
  CHECK(dp.state() == 3 * 8400000);
  CHECK(dp.peak() == whole);
  CHECK(dp.activations <= activations);
  CHECK(dp.buckets + dp.gathered + dp.transient + dp.master == 0);
}

TEST_CASE("ZeRO's bytes per GPU shrink with the GPUs in the sharded terms only", "[plan][zero]") {
  const Profile p = four_nodes();
  for (int level : {2, 3}) {
    ZeroMemory last;
    for (int gpus : {1, 2, 4, 8}) {
      INFO("ZeRO-" << level << " on " << gpus << " GPUs");
      const ZeroMemory m = zero_baseline(p, small_buckets(level, gpus)).memory;
      // Sharded: gradients, masters and optimizer state 1/D of them (rounded up per element).
      CHECK(m.gradients == (2100000 + gpus - 1) / gpus * 4);
      CHECK(m.master == m.gradients);
      CHECK(m.optimizer == m.gradients);
      if (level == 2) CHECK(m.parameters == 8400000);
      if (level == 3) CHECK(m.parameters == (8000000 + gpus - 1) / gpus + 400000);
      if (gpus > 1) {
        CHECK(m.gradients < last.gradients);
        CHECK(m.peak() < last.peak());
        CHECK(m.buckets == last.buckets);  // not sharded
        CHECK(m.activations == last.activations);
        CHECK(m.transient == last.transient);
      }
      last = m;
    }
  }
}

TEST_CASE("where parameters dominate, ZeRO-3 fits more than ZeRO-2, and ZeRO-2 more than plain data parallelism",
          "[plan][zero]") {
  const Profile p = parameter_heavy();
  ZeroBaselineOptions dp = small_buckets(0, 4);
  dp.capacity_bytes = zero_baseline(p.at_batch(8), dp).memory.peak();  // plain DP fits 8
  ZeroBaselineOptions two = dp, three = dp;
  two.level = 2, three.level = 3;
  const int64_t b0 = zero_max_batch(p, dp).micro_batch_size;
  const int64_t b2 = zero_max_batch(p, two).micro_batch_size;
  const int64_t b3 = zero_max_batch(p, three).micro_batch_size;
  CHECK(b0 == 8);
  CHECK(b2 > b0);
  CHECK(b3 > b2);
  CHECK(zero_max_batch(p, three).global_batch() == 4 * b3);
}

TEST_CASE("ZeRO's largest batch is the largest that fits", "[plan][zero]") {
  SyntheticOptions activation_heavy;  // 0.1-2 MB of activations a sample per node, 0-3 MB of parameters
  activation_heavy.nodes = 30;
  const Profile p = random_profile(12, activation_heavy);
  for (int level : {2, 3}) {
    ZeroBaselineOptions o = small_buckets(level, 2);
    o.capacity_bytes = zero_baseline(p.at_batch(37), o).memory.peak() + 1000;
    const ZeroBaseline best = zero_max_batch(p, o);
    CHECK(best.micro_batch_size == 37);
    CHECK(best.memory.peak() <= o.capacity_bytes);
    CHECK(zero_baseline(p.at_batch(38), o).memory.peak() > o.capacity_bytes);
    CHECK(zero_max_batch(p, o, 20).micro_batch_size == 20);  // the bound
    o.capacity_bytes = zero_baseline(p.at_batch(1), o).memory.peak() - 1;
    CHECK_THROWS_AS(zero_max_batch(p, o), InfeasibleError);
  }
}

TEST_CASE("the paper presets under ZeRO on four A100-40GB", "[plan][zero]") {
  // gpt2-large's 774M parameters: ZeRO-3 holds a quarter of them and gathers at most 5e7
  // elements plus its largest node (the 50257 x 1280 token embedding) besides.
  const Profile p = analytic_profile(build_model(preset_config("gpt2-large"), 1), device_spec("a100-40gb"));
  ZeroBaselineOptions two;
  two.data_parallel = 4;
  ZeroBaselineOptions three = two;
  three.level = 3;
  const ZeroMemory m2 = zero_baseline(p, two).memory, m3 = zero_baseline(p, three).memory;
  CHECK(m3.parameters < m2.parameters / 3);
  CHECK(m3.gathered <= (50000000 + 50257 * 1280) * 4);
  CHECK(m3.peak() < m2.peak());
}

TEST_CASE("pipeline planning refuses the ZeRO baseline", "[plan][zero]") {
  const Profile p = four_nodes();
  for (PlannerKind planner : {PlannerKind::Zero2, PlannerKind::Zero3}) {
    CHECK(is_zero_baseline(planner));
    PlanOptions o;
    o.stages = 1;
    o.planner = planner;
    CHECK_THROWS_WITH(make_plan(p, o), Catch::Contains("ZeRO's data-parallel baseline"));
    CHECK_THROWS_AS(try_plan(p, o), ConfigError);
    CHECK(zero_baseline_options(o).level == (planner == PlannerKind::Zero2 ? 2 : 3));
  }
  CHECK(from_name<PlannerKind>("zero3") == PlannerKind::Zero3);
  CHECK_FALSE(is_zero_baseline(PlannerKind::DawnPiper));
  CHECK_THROWS_AS(zero_level(PlannerKind::GPipe), ConfigError);
  ZeroBaselineOptions bad;
  bad.level = 4;
  CHECK_THROWS_AS(zero_baseline(p, bad), ConfigError);
  bad.level = 2;
  bad.data_parallel = 0;
  CHECK_THROWS_AS(zero_baseline(p, bad), ConfigError);
}
