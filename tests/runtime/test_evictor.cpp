// The evictor carries out swap and recompute decisions without changing a single bit of what
// training computes: parameters after k steps equal those of the same run keeping everything.
#include "torch_test.h"

#include "chunked_preset.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "memory/counting_allocator.h"
#include "models/model_config.h"
#include "plan/cost_model.h"
#include "plan/planner.h"
#include "plan/stage_memory.h"
#include "profile/profiler.h"
#include "measured_peak.h"
#include "quick_profile.h"
#include "two_stage_setup.h"
#include "runtime/pipeline.h"
#include "runtime/pipeline_stage.h"
#include "runtime/swap_copier.h"
#include "runtime/transport.h"
#include "util/error.h"

using namespace dawnpiper;
using dawnpiper::test::quick_profile;

namespace {

enum class Policy { Swap, Recompute, Mixed };

// A stage's decisions with every evictable tensor swapped, recomputed (when this stage
// produces it; swapped otherwise) or alternately one and the other.
std::vector<TensorDecision> evict_all(const CostModel& model, const StagePlan& s, Policy policy) {
  const Profile& profile = model.profile();
  std::vector<TensorDecision> ds = s.decisions;
  int k = 0;
  for (TensorDecision& d : ds) {
    const TensorProfile& t = profile.tensors[static_cast<size_t>(d.tensor)];
    if (!model.evictable(d.tensor)) continue;
    const bool recomputable = !t.is_data && t.producer >= s.begin && t.producer < s.end;
    const bool recompute = policy == Policy::Recompute || (policy == Policy::Mixed && k++ % 2 == 0);
    d.action = recompute && recomputable ? TensorAction::Recompute : TensorAction::Swap;
  }
  return ds;
}

// The plan's stages with evict_all's decisions placed.
std::vector<std::vector<Eviction>> decide(const CostModel& model, const Plan& plan, Policy policy) {
  std::vector<std::vector<Eviction>> out;
  for (const StagePlan& s : plan.stages)
    out.push_back(place_evictions(model, s.begin, s.end, evict_all(model, s, policy)));
  return out;
}

// Stage x of the pipeline run alone (stand-in transport) through its action list: the counting
// allocator's peak above what was allocated before, the stage's parameters included.
int64_t measured_stage_peak(CountingAllocator& counter, const OpGraph& g, const PipelineConfig& pc, int x) {
  const int64_t base = counter.live_bytes();
  StandInTransport transport(at::Device(at::kCPU), 7, pc.schedule.traits().sends_in_flight);
  PipelineStage stage(g, stage_config(g, pc, x), transport);
  counter.reset_peak();
  for (const Action& a : stage_actions(g, pc, x)) stage.execute(a);
  return counter.peak_bytes() - base;
}

// Stage program `program` of `pc` run alone (stand-in transport) through its actions, twice for
// the synchronous schedules as the replay does: the counting allocator's peak above what was
// allocated before, and the evictor's actions in the order it carried them out.
int64_t run_program(CountingAllocator& counter, const OpGraph& g, const PipelineConfig& pc, const StageProgram& program,
                    std::vector<Action>& events, std::vector<int64_t>* event_live = nullptr) {
  const int64_t base = counter.live_bytes();
  StandInTransport transport(at::Device(at::kCPU), 7, pc.schedule.traits().sends_in_flight);
  PipelineStage stage(g, stage_config(g, pc, program.stage), transport);
  if (stage.evictor())
    stage.evictor()->set_listener(
        [&](ActionKind kind, int64_t mb, int tensor, int64_t, Evictor::Clock::time_point, Evictor::Clock::time_point) {
          events.push_back(Action{kind, program.stage, mb, tensor});
          if (event_live) event_live->push_back(counter.live_bytes() - base);
        });
  counter.reset_peak();
  for (int pass = 0; pass < (pc.schedule == ScheduleChoice::named("async") ? 1 : 2); ++pass)
    for (const Action& a : program.actions) stage.execute(a);
  return counter.peak_bytes() - base;
}

// Bitwise the same losses and final parameters.
void check_same_training(const InProcessResult& r, const InProcessResult& kept) {
  REQUIRE(r.losses.size() == kept.losses.size());
  for (size_t s = 0; s < r.losses.size(); ++s) CHECK(r.losses[s].loss == kept.losses[s].loss);
  for (size_t x = 0; x < r.parameters.size(); ++x)
    for (size_t i = 0; i < r.parameters[x].size(); ++i)
      CHECK(at::equal(r.parameters[x][i].tensor, kept.parameters[x][i].tensor));
}

}  // namespace

TEST_CASE("swap and recompute leave parameters bitwise unchanged in every schedule", "[runtime][evictor]") {
  at::set_num_threads(1);
  // gpt2-tiny and t5-tiny have dropout (recomputation must redraw the same masks); t5 has
  // relative position biases and RMS norms, bert a separate classifier head, amoebanet max
  // pooling (whose indices are evicted too); gpt2-tiny+attn draws its attention dropout inside
  // one scaled_dot_product_attention call, seeded like a dropout node.
  for (const std::string preset : {"gpt2-tiny", "t5-tiny", "bert-tiny", "amoebanet-tiny", "gpt2-tiny+attn"}) {
    const bool cnn = preset == "amoebanet-tiny", fused_attention = preset == "gpt2-tiny+attn";
    OpGraph g = build_model(test::chunked_preset(preset), 2);
    const Profile profile = quick_profile(g);
    for (ScheduleChoice kind :
         {ScheduleChoice::named("gpipe"), ScheduleChoice::named("1f1b"), ScheduleChoice::named("async")}) {
      PlanOptions po;
      po.stages = 2;
      po.schedule = kind;
      po.micro_batches = 3;
      po.memopt = MemoptKind::None;
      const Plan plan = make_plan(profile, po);
      PipelineConfig pc;
      pc.schedule = kind;
      for (const StagePlan& s : plan.stages) pc.ranges.push_back({s.begin, s.end});
      pc.micro_batches = 3;
      pc.steps = 2;
      pc.optimizer.kind = OptimizerKind::Adam;
      const InProcessResult kept = run_pipeline_in_process(g, pc);
      for (Policy policy : {Policy::Swap, Policy::Recompute, Policy::Mixed}) {
        INFO(preset << " " << name_of(kind) << " policy " << static_cast<int>(policy));
        PipelineConfig evicting = pc;
        evicting.evictions = decide(CostModel(profile, po), plan, policy);
        // Dropout masks, matmul operand copies, pooling indices, the loss's log-probabilities.
        std::set<std::string> internal_kinds;
        for (const std::vector<Eviction>& stage : evicting.evictions)
          for (const Eviction& ev : stage)
            if (ev.internal.node >= 0) internal_kinds.insert(profile.nodes[static_cast<size_t>(ev.internal.node)].kind);
        CHECK(internal_kinds ==
              (cnn ? std::set<std::string>{"cross_entropy", "maxpool2d"}
                   : (fused_attention ? std::set<std::string>{"cross_entropy", "dropout"}
                                      : std::set<std::string>{"cross_entropy", "dropout", "matmul"})));
        check_same_training(run_pipeline_in_process(g, evicting), kept);
      }
    }
  }
}

TEST_CASE("evictions are placed the same in whatever order the decisions come", "[runtime][evictor]") {
  // The optimizer lists decisions by tensor id; a plan file may not. The evictions come in the
  // decisions' order, each the same (re-run chains included).
  auto by_tensor = [](std::vector<Eviction> list) {
    std::sort(list.begin(), list.end(), [](const Eviction& x, const Eviction& y) { return x.tensor < y.tensor; });
    return list;
  };
  int reruns = 0;
  for (const char* preset : {"gpt2-tiny", "t5-tiny"}) {
    OpGraph g = build_model(preset_config(preset), 2);
    const Profile profile = quick_profile(g);
    PlanOptions po;
    po.stages = 3;
    po.memopt = MemoptKind::None;
    po.planner = PlannerKind::Even;  // cuts by block count: the measured times must not move them
    const Plan plan = make_plan(profile, po);
    const CostModel model(profile, po);
    for (const StagePlan& s : plan.stages) {
      INFO(preset << " stage " << s.index);
      const std::vector<TensorDecision> ds = evict_all(model, s, Policy::Mixed);
      const std::vector<Eviction> placed = place_evictions(model, s.begin, s.end, ds);
      REQUIRE(placed.size() >= 2);
      reruns += std::any_of(placed.begin(), placed.end(), [](const Eviction& ev) { return !ev.rerun.empty(); });
      std::vector<TensorDecision> reversed(ds.rbegin(), ds.rend());
      const bool same_reversed = by_tensor(place_evictions(model, s.begin, s.end, reversed)) == by_tensor(placed);
      CHECK(same_reversed);
    }
  }
  CHECK(reruns >= 4);  // re-run chains placed in most stages
}

TEST_CASE("decisions a stage cannot carry out are refused where they are placed and run", "[runtime][evictor]") {
  OpGraph g = build_model(preset_config("mlp-tiny"), 2);
  const Profile profile = quick_profile(g);
  const CostModel model(profile, PlanOptions{});
  const int mid = g.size() / 2;
  // Recomputing a tensor another stage produced.
  int received = -1;
  for (const CrossingTensor& c : g.crossing(mid)) received = c.tensor;
  REQUIRE(received >= 0);
  CHECK_THROWS_AS(place_evictions(model, mid, g.size(), {{received, 0, TensorAction::Recompute, -1}}), ConfigError);
  // The loss's log-probabilities, an internal buffer the executor holds, are placed with the
  // node that makes them; a stage without that node refuses them.
  int log_probs = -1;
  for (const TensorProfile& t : profile.tensors)
    if (t.internal) log_probs = t.id;
  REQUIRE(log_probs >= 0);
  REQUIRE(model.evictable(log_probs));
  const std::vector<Eviction> lp = place_evictions(model, mid, g.size(), {{log_probs, 0, TensorAction::Swap, -1}});
  REQUIRE(lp.size() == 1);
  CHECK(lp[0].internal.node == profile.tensors[static_cast<size_t>(log_probs)].producer);
  CHECK(lp[0].internal.copy_of == -1);
  CHECK(Evictor(StageModule(g, mid, g.size(), 1), lp).active());
  CHECK_THROWS_AS(Evictor(StageModule(g, 0, mid, 1), lp), ConfigError);
  // An internal buffer the executor does not hold (normalization statistics), or a tensor the
  // profile does not have.
  {
    OpGraph gpt = build_model(preset_config("gpt2-tiny"), 2);
    const Profile gp = quick_profile(gpt);
    const CostModel gm(gp, PlanOptions{});
    int statistics = -1;
    for (const TensorProfile& t : gp.tensors)
      if (t.internal && !gm.evictable(t.id)) statistics = t.id;
    REQUIRE(statistics >= 0);
    CHECK(gp.nodes[static_cast<size_t>(gp.tensors[static_cast<size_t>(statistics)].producer)].kind == "layernorm");
    CHECK_THROWS_AS(place_evictions(gm, 0, gpt.size(), {{statistics, 0, TensorAction::Swap, -1}}), ConfigError);
  }
  CHECK_THROWS_AS(place_evictions(model, 0, g.size(), {{-3, 0, TensorAction::Swap, -1}}), ConfigError);
  // Keep decisions place nothing, and need no evictor.
  CHECK(place_evictions(model, mid, g.size(), {{received, 0, TensorAction::Keep, -1}}).empty());
  StageModule module(g, mid, g.size(), 1);
  CHECK_FALSE(Evictor(module, {}).active());
  // A swap placed on the other stage's nodes (a program for another stage), or of an internal buffer.
  const std::vector<Eviction> first = place_evictions(model, 0, mid, {{received, 0, TensorAction::Swap, -1}});
  REQUIRE(first.size() == 1);
  CHECK_THROWS_AS(Evictor(module, first), ConfigError);
  Eviction outside = first.front();
  outside.tensor = static_cast<int>(g.tensors.size());
  CHECK_THROWS_AS(Evictor(StageModule(g, 0, mid, 1), {outside}), ConfigError);
  CHECK(Evictor(StageModule(g, 0, mid, 1), first).active());
}

TEST_CASE("swapped bytes leave the device allocator and come back unchanged", "[runtime][evictor]") {
  CountingAllocator& counter = CountingAllocator::install();
  SwapCopier copier(at::Device(at::kCPU));
  at::Tensor t = at::arange(1 << 16, at::kFloat);
  const at::Tensor expected = t.clone();
  const int64_t bytes = static_cast<int64_t>(t.storage().nbytes());
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const int64_t before = counter.live_bytes();
  c10::DataPtr host = copier.copy_out(storage->set_data_ptr(c10::DataPtr(nullptr, t.device())), bytes);
  CHECK(counter.live_bytes() == before - bytes);  // the host copy is not charged
  SwapCopier::Incoming back = copier.copy_in(std::move(host), bytes);
  CHECK(counter.live_bytes() == before);  // charged again from the copy back on
  copier.wait(back);
  storage->set_data_ptr_noswap(std::move(back.data));
  CHECK(at::equal(t, expected));
}

// The planner's memory replay (plan/stage_memory) and the runtime run one stage program and
// agree: the same evictor actions in the same order, and the peak. For random
// keep/swap/recompute decisions (recompute chains, re-runs shared by several evictions, inputs
// held for a later re-run, swapped inputs of a re-run, swaps prefetched early) and tied
// weights, a stage cut at a block boundary or inside a block (sending transposed views,
// receiving gradients that flow into views), run alone, peaks at the replayed prediction. The stand-in transport holds
// a send until the next one, as the replay assumes of MPI.
TEST_CASE("one stage program: the replay predicts the evictor's actions and measured peak", "[runtime][evictor]") {
  at::set_num_threads(1);
  CountingAllocator& counter = CountingAllocator::install();
  // "preset/k": its output projection in k chunks, so that cuts fall between them too;
  // "preset@t": the projection fused with the loss (t positions at a time); "+attn": fused
  // attention calls (T5's decoder: a causal-masked position bias).
  int carried_over = 0;
  for (std::string preset : {"gpt2-tiny", "bert-tiny", "t5-tiny", "amoebanet-tiny", "gpt2-tiny/4", "bert-tiny/3",
                             "gpt2-tiny@48", "t5-tiny+attn", "gpt2-tiny@64 seq-len=64 dropout=0"}) {
    OpGraph g = build_model(test::chunked_preset(preset), 4);
    const Profile profile = quick_profile(g);
    std::mt19937 rng(11), rng_h2(13);
    // Fixed cuts (not the planner's, which follow the profiled timings): every block boundary,
    // and every eighth of the graph (gpt2-tiny's node 16 sends three transposed views).
    std::set<int> cuts = test::block_and_eighth_cuts(g, profile);
    for (const Node& n : g.nodes)  // between the chunks of an output projection
      if (n.name.find(".chunk") != std::string::npos && n.name.compare(n.name.size() - 6, 6, "chunk0") != 0)
        cuts.insert(n.id);
    for (int cut : cuts)
      for (ScheduleChoice kind :
           {ScheduleChoice::named("gpipe"), ScheduleChoice::named("1f1b"), ScheduleChoice::named("async"),
            ScheduleChoice::named("zb-h1"), ScheduleChoice::named("zb-h2")}) {
        test::TwoStages two(profile, g.size(), cut, kind, /*steps=*/3);
        const CostModel& model = two.model;
        PipelineConfig& pc = two.pc;
        for (int round = 0; round < 2; ++round) {
          pc.evictions.clear();
          std::vector<StageProgram> programs;
          for (const auto& [b, e] : pc.ranges) {
            // Second round: swaps come back from a prefetch point up to the stage's last node.
            // zb-h2 draws from its own generator: the other schedules' draws stay what they were.
            const std::vector<TensorDecision> ds =
                test::random_decisions(model, profile, b, e, kind == ScheduleChoice::named("zb-h2") ? rng_h2 : rng,
                                       /*random_prefetch=*/round == 1);
            programs.push_back(stage_program(model, b, e, static_cast<int>(programs.size()), ds));
            pc.evictions.push_back(programs.back().evictions);
          }
          for (int x = 0; x < 2; ++x) {
            std::vector<Action> replayed, executed;
            std::vector<int64_t> replayed_live, executed_live;
            const int64_t predicted =
                replay_stage_program(model, programs[static_cast<size_t>(x)], &replayed, &replayed_live).peak;
            int64_t measured = 0;
            try {
              measured = run_program(counter, g, pc, programs[static_cast<size_t>(x)], executed, &executed_live);
            } catch (const ConfigError& e) {  // a stage holding the tied embedding and a chunk of its projection
              CHECK(kind.traits().splits_backward);
              CHECK_THAT(e.what(), Catch::Contains("cannot split its backward"));
              continue;
            }
            INFO(preset << " cut " << cut << " " << name_of(kind) << " round " << round << " stage " << x
                        << ": measured " << measured << " predicted " << predicted);
            // The same program: the evictor swaps, fetches and re-runs in the replayed order.
            CHECK(to_string(replayed) == to_string(executed));
            // What a synchronous step leaves for the next (optimizer state, the last send's
            // activations, still referenced by the transport until the next send completes): the
            // bytes live at the two steps' first swap-out differ by as much in the replay as in
            // the run, up to the stage's constants (causal masks, position buckets): the replay
            // counts them from the start, the run makes them at their node of the first forward,
            // some after its first swap-out.
            const size_t half = replayed.size() / 2;
            // (A split backward's replay carries up to one gradient more across the step on some
            // stages: on the safe side, left out here.)
            const bool split = kind.traits().splits_backward;
            if (kind != ScheduleChoice::named("async") && !split && half > 0 && replayed.size() == executed.size() &&
                replayed[0].kind == ActionKind::SwapOut && replayed[half].kind == ActionKind::SwapOut) {
              ++carried_over;
              const StageProgram& program = programs[static_cast<size_t>(x)];
              const int64_t more = (executed_live[half] - executed_live[0]) - (replayed_live[half] - replayed_live[0]);
              CHECK(more >= 0);
              CHECK(more <= model.constant_bytes(program.begin, program.end));
            }
            if (!programs[static_cast<size_t>(x)].evictions.empty()) CHECK_FALSE(executed.empty());
            // Never below the measurement (a plan must fit); at most 10% above: the profile's
            // backward workspaces, measured node by node, run up to one output larger than
            // inside a whole backward (dropout; t5-tiny's first block boundary: +7%). The
            // chunks of an LM head (bert-tiny/3, gpt2-tiny/4 on the stage holding them) up to
            // 13% above: each chunk's slice of the logits' gradient is counted as copied where
            // its linear reads it, and the sum of two linears' input gradients as a new buffer
            // (both right at other cuts of the same heads; which of them the run skips there is
            // not known).
            // amoebanet-tiny's cells' sums hand slices of the concat's gradient on to batch
            // norms: the whole lives until the last slice goes, or until I ends where W holds
            // one (find_concat_wholes), and I copies each held region once (own_slices).
            // Split backwards (zb-h1, zb-h2) measure at most their replay elsewhere since I copies the slices of a
            // concat's gradient that W holds where they do not cover it, and the inputs' slices
            // (exec/split_backward.cpp): before, each held the whole until W or the send
            // (amoebanet-tiny cut 26 under zb-h2 measured 1.02% above).
            const bool chunked_head = preset == "bert-tiny/3" || preset == "gpt2-tiny/4";
            CHECK(measured <= predicted);
            CHECK(double(measured) >= (chunked_head ? 0.87 : 0.90) * double(predicted));
          }
        }
      }
  }
  CHECK(carried_over > 500);
}

TEST_CASE("interleaved: a rank's stages replayed together predict its measured peak", "[runtime][evictor]") {
  at::set_num_threads(1);
  CountingAllocator& counter = CountingAllocator::install();
  std::mt19937 rng(5);
  for (const char* preset : {"gpt2-tiny", "bert-tiny", "t5-tiny"}) {
    OpGraph g = build_model(preset_config(preset), 4);
    const Profile profile = quick_profile(g);
    PlanOptions po;
    po.stages = 4;
    po.schedule = ScheduleChoice::named("interleaved").with_virtual_stages(2);
    po.micro_batches = 4;
    const CostModel model(profile, po);
    for (int shift : {0, 3, 7}) {
      PipelineConfig pc;
      pc.schedule = po.schedule;
      pc.micro_batches = po.micro_batches;
      pc.steps = 2;
      for (int x = 0; x < 4; ++x)
        pc.ranges.push_back(
            {x == 0 ? 0 : g.size() * x / 4 + shift, x == 3 ? g.size() : g.size() * (x + 1) / 4 + shift});
      for (int round = 0; round < 2; ++round) {  // everything kept, then random swaps and re-runs
        std::vector<StageProgram> programs;
        pc.evictions.clear();
        for (const auto& [b, e] : pc.ranges) {
          const std::vector<TensorDecision> ds =
              round == 0 ? std::vector<TensorDecision>{} : test::random_decisions(model, profile, b, e, rng);
          programs.push_back(stage_program(model, b, e, static_cast<int>(programs.size()), ds));
          pc.evictions.push_back(programs.back().evictions);
        }
        for (int r = 0; r < 2; ++r) {
          const int64_t predicted = replay_rank_peak(
              model, {programs[static_cast<size_t>(r)], programs[static_cast<size_t>(r) + 2]}, model.rank_actions(r));
          const int64_t measured = test::measured_rank_peak(counter, g, pc, r);
          INFO(preset << " shift " << shift << " round " << round << " rank " << r << ": measured " << measured
                      << " predicted " << predicted);
          CHECK(measured <= predicted);
          CHECK(double(measured) >= 0.95 * double(predicted));
        }
      }
    }
  }
}

// Two things the whole graph does differently from a stage: a matmul operand that is a
// transposed view is copied by the whole graph but arrives contiguous at a stage (no copy), and
// a tensor the stage reads and also relays to the next stage (T5's encoder output) gets the sum
// of its local and received gradients sent back. The replay counted the copy and the sum twice
// (6-8% over on this stage; what is left, 2-3%, are backward workspaces measured node by node).
TEST_CASE("a stage receiving a matmul operand and relaying a tensor it reads peaks at its replay",
          "[runtime][evictor]") {
  at::set_num_threads(1);
  CountingAllocator& counter = CountingAllocator::install();
  OpGraph g = build_model(preset_config("t5-tiny"), 4);
  const Profile profile = quick_profile(g);
  const int b = 82, e = 131;  // inside decoder layer 0's self-attention .. inside layer 1's
  REQUIRE(g.nodes[b].kind == OpKind::MatMul);
  bool received_copy = false, relayed_and_read = false;
  std::set<int> received;
  for (const CrossingTensor& c : g.crossing(b)) received.insert(c.tensor);
  for (const TensorProfile& t : profile.tensors) received_copy |= t.copy_of >= 0 && received.count(t.copy_of) > 0;
  for (const CrossingTensor& c : g.crossing(e))
    if (received.count(c.tensor))
      for (int reader : profile.tensors[static_cast<size_t>(c.tensor)].consumers)
        relayed_and_read |= reader >= b && reader < e;
  REQUIRE(received_copy);
  REQUIRE(relayed_and_read);
  for (ScheduleChoice kind : {ScheduleChoice::named("gpipe"), ScheduleChoice::named("async")}) {
    PlanOptions po;
    po.stages = 3;
    po.schedule = kind;
    po.micro_batches = 4;
    const CostModel model(profile, po);
    PipelineConfig pc;
    pc.schedule = kind;
    pc.ranges = {{0, b}, {b, e}, {e, g.size()}};
    pc.micro_batches = 4;
    pc.steps = 3;
    const int64_t predicted = replay_stage_memory(model, b, e, 1, {}).peak;
    const int64_t measured = measured_stage_peak(counter, g, pc, 1);
    INFO(name_of(kind) << ": measured " << measured << " predicted " << predicted);
    CHECK(measured <= predicted);
    CHECK(double(measured) >= 0.955 * double(predicted));  // before: 0.94 (gpipe), 0.93 (async)
  }
}

// The baselines' coarse modes (gpipe and vpipe: whole blocks recomputed or swapped, block
// outputs kept as checkpoints) are plain decisions to the runtime: training is bitwise
// unchanged and each stage peaks at its replayed prediction. (Some combinations have no
// capacity at which whole blocks are worth evicting: t5-tiny under gpipe's split, whose peak
// stage is bound by what no block eviction removes.)
TEST_CASE("block-level recompute and swap plans of gpipe and vpipe run bitwise unchanged", "[runtime][evictor]") {
  at::set_num_threads(1);
  CountingAllocator& counter = CountingAllocator::install();
  std::map<PlannerKind, int> tested;  // planner -> plans run
  for (const char* preset : {"gpt2-tiny", "t5-tiny"}) {
    OpGraph g = build_model(preset_config(preset), 2);
    const Profile profile = quick_profile(g);
    for (PlannerKind planner : {PlannerKind::GPipe, PlannerKind::VPipe})
      for (MemoptKind memopt : {MemoptKind::Recompute, MemoptKind::SwapRecompute}) {
        INFO(preset << " " << planner << " " << memopt);
        PlanOptions po;
        po.stages = 2;
        po.schedule = ScheduleChoice::named("1f1b");
        po.micro_batches = 3;
        po.planner = planner;
        po.memopt = memopt;
        po.fit_replayed = true;
        const int64_t unoptimized = make_plan(profile, po).max_predicted_peak_bytes();
        // The largest capacity, in 1% steps, that needs evictions.
        std::optional<Plan> plan;
        for (int pct = 99; pct >= 40 && !plan; --pct) {
          po.capacity_bytes = unoptimized * pct / 100;
          plan = try_plan(profile, po);
          if (plan && std::all_of(plan->stages.begin(), plan->stages.end(), [](const StagePlan& s) {
                return std::all_of(s.decisions.begin(), s.decisions.end(),
                                   [](const TensorDecision& d) { return d.action == TensorAction::Keep; });
              }))
            plan.reset();
        }
        if (!plan) continue;
        ++tested[planner];
        // Whole blocks: one action per block, several tensors evicted together somewhere.
        size_t largest_unit = 0;
        for (const StagePlan& s : plan->stages) {
          std::map<int, std::pair<TensorAction, size_t>> by_block;
          for (const TensorDecision& d : s.decisions) {
            if (d.action == TensorAction::Keep) continue;
            const int block =
                profile.nodes[static_cast<size_t>(profile.tensors[static_cast<size_t>(d.tensor)].producer)].block;
            auto [it, fresh] = by_block.emplace(block, std::make_pair(d.action, size_t{0}));
            CHECK(it->second.first == d.action);
            largest_unit = std::max(largest_unit, ++it->second.second);
          }
        }
        CHECK(largest_unit >= 2);
        PipelineConfig pc;
        pc.schedule = ScheduleChoice::named("1f1b");
        for (const StagePlan& s : plan->stages) pc.ranges.push_back({s.begin, s.end});
        pc.micro_batches = 3;
        pc.steps = 2;
        const InProcessResult kept = run_pipeline_in_process(g, pc);
        PipelineConfig evicting = pc;
        for (const StagePlan& s : plan->stages) evicting.evictions.push_back(s.evictions);
        check_same_training(run_pipeline_in_process(g, evicting), kept);
        for (int x = 0; x < 2; ++x) {
          const int64_t measured = measured_stage_peak(counter, g, evicting, x);
          INFO("stage " << x << ": measured " << measured << ", replayed "
                        << plan->stages[static_cast<size_t>(x)].memory.replayed_peak);
          CHECK(measured <= plan->stages[static_cast<size_t>(x)].memory.replayed_peak);
        }
      }
  }
  CHECK(tested[PlannerKind::GPipe] >= 2);
  CHECK(tested[PlannerKind::VPipe] >= 2);
}
