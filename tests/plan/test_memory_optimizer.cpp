// The per-stage memory optimizer (Capuchin cost model): fits when it says so, never raises the
// peak, respects the mode, prefers free swaps, charges recompute chains, block granularity.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <set>

#include "plan/memory_optimizer.h"
#include "synthetic_profile.h"

using namespace dawnpiper;
using namespace dawnpiper::testing;

namespace {
int64_t evicted_bytes(const StageMemopt& r) {
  int64_t bytes = 0;
  for (const TensorDecision& d : r.decisions)
    if (d.action != TensorAction::Keep) bytes += d.bytes;
  return bytes;
}

// Twenty slow nodes (5-10 ms each): on one gpipe stage of 8 micro-batches every saved tensor
// idles for 7 other passes.
Profile twenty_slow_nodes() {
  SyntheticOptions o;
  o.nodes = 20;
  o.fwd_min_ms = 5;
  o.fwd_max_ms = 10;
  return random_profile(5, o);
}

PlanOptions one_gpipe_stage(double host_bandwidth) {
  PlanOptions opt;
  opt.stages = 1;
  opt.schedule = ScheduleChoice::named("gpipe");
  opt.micro_batches = 8;
  opt.host_bandwidth = host_bandwidth;
  return opt;
}
}  // namespace

TEST_CASE("memory optimization fits the capacity and never raises the peak", "[plan][memopt]") {
  std::mt19937_64 rng(11);
  int optimized = 0, infeasible = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    SyntheticOptions o;
    o.nodes = 30;
    o.skip_probability = 0.3;
    Profile p = random_profile(seed, o);
    PlanOptions opt;
    opt.stages = 3;
    opt.schedule = seed % 3 == 0   ? ScheduleChoice::named("gpipe")
                   : seed % 3 == 1 ? ScheduleChoice::named("1f1b")
                                   : ScheduleChoice::named("async");
    opt.micro_batches = 4;
    CostModel m(p, opt);
    for (int trial = 0; trial < 6; ++trial) {
      int b = std::uniform_int_distribution<int>(0, 20)(rng);
      int e = std::uniform_int_distribution<int>(b + 1, 30)(rng);
      int x = std::uniform_int_distribution<int>(0, 2)(rng);
      int64_t before = m.peak_without_memopt(b, e, x);
      int64_t capacity = static_cast<int64_t>(before * std::uniform_real_distribution<double>(0.3, 1.1)(rng));
      for (MemoptKind mode : {MemoptKind::None, MemoptKind::Recompute, MemoptKind::SwapRecompute}) {
        MemoryOptimizer opt_(m, mode, capacity);
        StageMemopt r = opt_.optimize(b, e, x, true);
        INFO("seed " << seed << " [" << b << "," << e << ") x " << x << " mode " << name_of(mode));
        CHECK(r.peak_before == before);
        CHECK(r.peak <= r.peak_before);
        CHECK(r.overhead_ms >= 0);
        CHECK(r.peak == r.peak_before - m.in_flight(x) * evicted_bytes(r));
        CHECK(r.activation_per_micro_batch == m.activation_bytes(b, e) - evicted_bytes(r));
        CHECK(r.feasible == (r.peak <= capacity));
        int swaps = 0, recomputes = 0;
        for (const TensorDecision& d : r.decisions) {
          swaps += d.action == TensorAction::Swap;
          recomputes += d.action == TensorAction::Recompute;
        }
        CHECK(swaps == r.swapped);
        CHECK(recomputes == r.recomputed);
        if (before <= capacity || mode == MemoptKind::None) {
          CHECK(swaps + recomputes == 0);
          CHECK(r.overhead_ms == 0);
          CHECK(r.feasible == (before <= capacity));
        }
        if (mode == MemoptKind::Recompute) CHECK(swaps == 0);
        if (before > capacity && mode != MemoptKind::None) (r.feasible ? ++optimized : ++infeasible);
        // Without decisions the same answer comes back.
        MemoryOptimizer again(m, mode, capacity);
        StageMemopt quick = again.optimize(b, e, x, false);
        CHECK(quick.feasible == r.feasible);
        CHECK(quick.overhead_ms == Approx(r.overhead_ms));
      }
    }
  }
  CHECK(optimized > 50);   // the optimizer really had work to do
  CHECK(infeasible > 10);  // and some capacities were out of reach
}

TEST_CASE("overlapped swaps come first and cost nothing", "[plan][memopt]") {
  // GPipe with 8 micro-batches: every saved tensor idles for 7 other passes of slow nodes, far
  // longer than its transfer, so swaps hide completely.
  const Profile p = twenty_slow_nodes();
  CostModel m(p, one_gpipe_stage(16e9));
  int64_t before = m.peak_without_memopt(0, 20, 0);
  MemoryOptimizer sr(m, MemoptKind::SwapRecompute, before * 7 / 10);
  StageMemopt r = sr.optimize(0, 20, 0, true);
  CHECK(r.feasible);
  CHECK(r.swapped > 0);
  CHECK(r.recomputed == 0);
  CHECK(r.overhead_ms == 0);
  // Recompute-only has to pay for the same saving.
  MemoryOptimizer ro(m, MemoptKind::Recompute, before * 7 / 10);
  StageMemopt rr = ro.optimize(0, 20, 0, true);
  CHECK(rr.feasible);
  CHECK(rr.overhead_ms > 0);
}

TEST_CASE("a swap's copy back starts early enough to hide behind the backward", "[plan][memopt]") {
  const Profile p = twenty_slow_nodes();
  for (double bandwidth : {16e9, 1e8, 1e6}) {
    CostModel m(p, one_gpipe_stage(bandwidth));
    MemoryOptimizer sr(m, MemoptKind::SwapRecompute, m.peak_without_memopt(0, 20, 0) * 7 / 10);
    StageMemopt r = sr.optimize(0, 20, 0, true);
    int swaps = 0, early = 0;
    for (const TensorDecision& d : r.decisions) {
      if (d.action != TensorAction::Swap) {
        CHECK(d.prefetch_at == -1);
        continue;
      }
      INFO("bandwidth " << bandwidth << ", tensor " << d.tensor);
      ++swaps;
      early += d.prefetch_at > d.restore_before;
      REQUIRE(d.prefetch_at >= d.restore_before);
      REQUIRE(d.prefetch_at < 20);
      const double copy_ms = m.host_ms(d.bytes);
      // The nodes whose backward runs during the copy cover it, or the copy starts with the
      // stage's backward; one node fewer would not cover it.
      CHECK((m.bwd_ms(d.restore_before + 1, d.prefetch_at + 1) >= copy_ms || d.prefetch_at == 19));
      if (d.prefetch_at > d.restore_before) CHECK(m.bwd_ms(d.restore_before + 1, d.prefetch_at) < copy_ms);
    }
    CHECK(swaps > 0);
    if (bandwidth == 1e6) CHECK(early == swaps);  // MB-sized tensors at 1 MB/s: the copy never fits one node
  }
}

TEST_CASE("recomputing a tensor re-runs the producers of inputs that are gone", "[plan][memopt]") {
  // input -> a -> b -> c -> loss. a saves the data it reads; b saves nothing (like an add);
  // c saves b's output. Rebuilding b's output needs b, whose input (a's output) nobody kept,
  // so a re-runs too: the cost is fwd(a) + fwd(b).
  Profile p;
  p.micro_batch_size = 1;
  p.nodes.push_back(make_node(0, "input", 0));
  int data = add_tensor(p, 0, 1000, true);
  const double fwd[] = {0, 1.0, 2.0, 3.0, 0.5};
  for (int i = 1; i <= 4; ++i) {
    NodeProfile n = make_node(i, "op", i);
    set_time(n, fwd[i], 2 * fwd[i]);
    p.nodes.push_back(n);
  }
  int ta = add_tensor(p, 1, 4000);
  int tb = add_tensor(p, 2, 8000);
  int tc = add_tensor(p, 3, 2000);
  add_tensor(p, 4, 4);
  consume(p, 1, data);
  save(p, 1, data);
  consume(p, 2, ta);
  consume(p, 3, tb);
  save(p, 3, tb);
  consume(p, 4, tc);
  consume(p, 4, data);
  PlanOptions opt;
  opt.stages = 1;
  opt.schedule = ScheduleChoice::named("1f1b");
  opt.micro_batches = 1;
  CostModel m(p, opt);
  REQUIRE(m.activation_bytes(0, 5) == 9000);
  const int64_t before = m.peak_without_memopt(0, 5, 0);
  MemoryOptimizer r(m, MemoptKind::Recompute, before - 5000);
  StageMemopt out = r.optimize(0, 5, 0, true);
  REQUIRE(out.feasible);
  CHECK(out.recomputed == 1);
  CHECK(out.overhead_ms == Approx(fwd[1] + fwd[2]));
  for (const TensorDecision& d : out.decisions)
    CHECK(d.action == (d.tensor == tb ? TensorAction::Recompute : TensorAction::Keep));
  // The data tensor cannot be recomputed (no producer to re-run), only swapped: asking for
  // more than b's output is infeasible for recompute-only.
  MemoryOptimizer tight(m, MemoptKind::Recompute, before - 8500);
  CHECK_FALSE(tight.optimize(0, 5, 0, false).feasible);
  MemoryOptimizer swap(m, MemoptKind::SwapRecompute, before - 8500);
  CHECK(swap.optimize(0, 5, 0, false).feasible);
}

TEST_CASE("block granularity evicts whole blocks", "[plan][memopt]") {
  SyntheticOptions o;
  o.nodes = 40;
  o.nodes_per_block = 5;
  Profile p = random_profile(9, o);
  PlanOptions opt;
  opt.stages = 2;
  opt.schedule = ScheduleChoice::named("1f1b");
  CostModel m(p, opt);
  int64_t before = m.peak_without_memopt(0, 25, 0);
  for (MemoptKind mode : {MemoptKind::Recompute, MemoptKind::SwapRecompute}) {
    MemoryOptimizer blocks(m, mode, before * 8 / 10, MemoptGranularity::Block);
    StageMemopt r = blocks.optimize(0, 25, 0, true);
    REQUIRE(r.feasible);
    CHECK(r.peak <= before * 8 / 10);
    // Within a block, every tensor produced and read only there gets the same decision.
    std::map<int, std::set<TensorAction>> per_block;
    for (const TensorDecision& d : r.decisions) {
      const TensorProfile& t = p.tensors[static_cast<size_t>(d.tensor)];
      int block = p.nodes[static_cast<size_t>(t.producer)].block;
      bool internal = !t.is_data && t.producer < 25;
      for (int c : t.consumers) internal = internal && p.nodes[static_cast<size_t>(c)].block == block && c < 25;
      for (int s : t.saved_by) internal = internal && p.nodes[static_cast<size_t>(s)].block == block && s < 25;
      if (internal)
        per_block[block].insert(d.action);
      else
        CHECK(d.action == TensorAction::Keep);  // block inputs and outputs stay as checkpoints
    }
    int evicted_blocks = 0;
    for (const auto& kv : per_block) {
      CHECK(kv.second.size() == 1);
      evicted_blocks += *kv.second.begin() != TensorAction::Keep;
    }
    CHECK(evicted_blocks > 0);
  }
}

TEST_CASE("internal buffers count but are never evicted; views count nothing", "[plan][memopt]") {
  SyntheticOptions o;
  o.nodes = 20;
  o.save_output_probability = 0.5;
  Profile p = random_profile(13, o);
  // Half of the saved tensors become autograd-internal buffers (say dropout masks).
  std::set<int> internal;
  for (TensorProfile& t : p.tensors)
    if (!t.saved_by.empty() && t.id % 2 == 0 && !t.is_data) {
      t.internal = true;
      internal.insert(t.id);
    }
  REQUIRE(internal.size() > 3);
  PlanOptions opt;
  opt.stages = 1;
  opt.schedule = ScheduleChoice::named("1f1b");
  CostModel m(p, opt);
  const int64_t all = m.activation_bytes(0, 20);
  int64_t internal_bytes = 0;
  for (int t : internal) internal_bytes += p.tensors[static_cast<size_t>(t)].bytes;
  const int64_t floor = m.peak_without_memopt(0, 20, 0) - (all - internal_bytes);
  int64_t data_bytes = 0;  // the loaded input can be swapped but not recomputed
  for (const TensorProfile& t : p.tensors)
    if (t.is_data && !t.saved_by.empty()) data_bytes += t.bytes;
  for (MemoptKind mode : {MemoptKind::Recompute, MemoptKind::SwapRecompute}) {
    // Down to the internal buffers (and, recomputing only, the data) everything can go.
    const int64_t lowest = floor + (mode == MemoptKind::Recompute ? data_bytes : 0);
    MemoryOptimizer enough(m, mode, lowest);
    StageMemopt r = enough.optimize(0, 20, 0, true);
    CHECK(r.feasible);
    CHECK(r.peak == lowest);
    for (const TensorDecision& d : r.decisions)
      if (internal.count(d.tensor)) CHECK(d.action == TensorAction::Keep);
    MemoryOptimizer too_tight(m, mode, lowest - 1);
    CHECK_FALSE(too_tight.optimize(0, 20, 0, false).feasible);
  }

  // A saved view allocates nothing (the profiler records the saving on its storage owner).
  Profile v = random_profile(13, o);
  int view = -1;
  for (TensorProfile& t : v.tensors)
    if (!t.saved_by.empty() && !t.is_data) view = t.id;
  REQUIRE(view >= 0);
  CostModel before(v, opt);
  v.tensors[static_cast<size_t>(view)].alias_of = 0;
  CostModel after(v, opt);
  CHECK(after.activation_bytes(0, 20) == before.activation_bytes(0, 20) - v.tensors[static_cast<size_t>(view)].bytes);
}

TEST_CASE("copies back queue on one stream: each starts where it and those before it end in time", "[plan][memopt]") {
  const Profile p = twenty_slow_nodes();
  for (double bandwidth : {16e9, 1e9, 1e8, 1e7}) {
    CostModel m(p, one_gpipe_stage(bandwidth));
    MemoryOptimizer sr(m, MemoptKind::SwapRecompute, m.peak_without_memopt(0, 20, 0) * 5 / 10);
    StageMemopt r = sr.optimize(0, 20, 0, true);
    // The side stream as the runtime fills it (runtime/evictor.cpp): copies back issued as the
    // backward (from node 19 down) reaches each one's prefetch node, at one node those read
    // first first. Each ends before the backward of the node that reads it, unless the copies
    // before it started with the stage's backward.
    std::vector<TensorDecision> swaps;
    for (const TensorDecision& d : r.decisions)
      if (d.action == TensorAction::Swap) swaps.push_back(d);
    std::stable_sort(swaps.begin(), swaps.end(), [](const TensorDecision& a, const TensorDecision& c) {
      return a.prefetch_at != c.prefetch_at ? a.prefetch_at > c.prefetch_at : a.restore_before > c.restore_before;
    });
    INFO("bandwidth " << bandwidth << ", " << swaps.size() << " swaps");
    REQUIRE(swaps.size() > 1);
    double stream_free = 0, wait = 0;
    bool all_from_the_start = true;  // every copy so far issued with the stage's backward
    int late = 0;
    for (const TensorDecision& d : swaps) {
      all_from_the_start = all_from_the_start && d.prefetch_at == 19;
      const double issued = m.bwd_ms(d.prefetch_at + 1, 20), needed = m.bwd_ms(d.restore_before + 1, 20);
      stream_free = std::max(issued, stream_free) + m.host_ms(d.bytes);
      if (stream_free > needed + 1e-9) {
        ++late;
        CHECK(all_from_the_start);  // only copies that could start no earlier may be late
        wait = std::max(wait, stream_free - needed);
      }
    }
    if (bandwidth == 16e9) CHECK(late == 0);
    // What the backward waits for is charged: the swaps' overhead holds at least the longest wait.
    CHECK(r.overhead_ms >= wait - 1e-9);
    // The stall the planner computes for the queue is the wait of the copies as the runtime issues them.
    CHECK(queued_copy_stall(m, 20, r.decisions) == Approx(wait).margin(1e-9));
    if (bandwidth == 1e7) CHECK(wait > 0);
    // (Placed one by one, each as if alone on the stream, two copies back end late at 1e8 B/s.)
  }
}
