// Per-stage memory of imported graphs: the planner's replay of a stage's action list against the
// counting allocator's peak of the same stage run alone, at every block boundary and every
// eighth of the graph, every schedule, keeping every tensor or evicting at random.
#include "import/import_test.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <string>

#include "data/synthetic.h"
#include "exec/stage_module.h"
#include "memory/counting_allocator.h"
#include "models/model_file.h"
#include "plan/cost_model.h"
#include "plan/stage_memory.h"
#include "profile/profiler.h"
#include "measured_peak.h"
#include "plan/planner.h"
#include "quick_profile.h"
#include "two_stage_setup.h"
#include "runtime/pipeline.h"
#include "runtime/pipeline_stage.h"
#include "runtime/transport.h"
#include "util/error.h"

using namespace dawnpiper;
using namespace dawnpiper::test;

namespace {

// What a stage run alone holds at its peak, as the counting allocator sees it (its transport
// keeps as many sends going as the schedule's ranks do).
int64_t measured_stage_peak(CountingAllocator& counter, const OpGraph& g, const PipelineConfig& pc, int x) {
  StandInTransport transport(at::Device(at::kCPU), 7, pc.schedule.traits().sends_in_flight);
  if (x > 0) transport.set_exact(exact_constant_inputs(g, pc.ranges[static_cast<size_t>(x)].first, pc.seed));
  const int64_t base = counter.live_bytes();  // not the stand-in's own copies of the inputs
  PipelineStage stage(g, stage_config(g, pc, x), transport);
  counter.reset_peak();
  for (const Action& a : stage_actions(g, pc, x)) stage.execute(a);
  return counter.peak_bytes() - base;
}

}  // namespace

// The profiler runs each node alone on inputs laid out as their producers' kernels laid them out
// there, which need not be what torch.export recorded: T5's attention has a mask that requires
// grad (the relative position bias), so on CPU it takes the math path and returns a contiguous
// output, where the export saw the fused kernel's transposed one. Then the reshape after the
// head transpose copies, and the linear saves the copy, not the attention's output. Every
// output of a whole-graph forward has the profile's contiguity and aliasing.
TEST_CASE("imported profiles have the layouts the stage's kernels make", "[import]") {
  at::set_num_threads(1);
  for (const char* name : {"gpt2", "bert", "t5", "llama", "gemma", "falcon", "gpt_bigcode"}) {
    const OpGraph g = build_imported(*read_model_file(test_model(name)), 4);
    const Profile profile = quick_profile(g);
    const StageModule module(g, 0, g.size(), 42);
    TensorEnv env = module.make_env();
    SyntheticData(g, 42).load(env, g.data_inputs(0, g.size()), 0, at::Device(at::kCPU));
    int checked = 0;
    module.forward(env, RunContext{}, {}, [&](int n, TensorEnv& e) {
      const Node& node = g.nodes[static_cast<size_t>(n)];
      for (int out : node.outputs) {
        const at::Tensor& t = e[static_cast<size_t>(out)];
        if (!t.defined() || node.kind == OpKind::Input) continue;
        bool shares_input = false;
        for (int in : node.inputs)
          shares_input = shares_input || (e[static_cast<size_t>(in)].defined() &&
                                          e[static_cast<size_t>(in)].storage().is_alias_of(t.storage()));
        const TensorProfile& tp = profile.tensors[static_cast<size_t>(out)];
        INFO(name << " " << tp.name << " (node " << n << ")");
        CHECK(tp.contiguous == (t.is_contiguous() ? 1 : 0));
        if (!tp.param_view) CHECK((tp.alias_of >= 0) == shares_input);
        ++checked;
      }
    });
    CHECK(checked > g.size() / 2);
  }
}

// CodeGen's value is a slice of one fused projection, reshaped into heads and transposed: a
// stage receiving it lays it out so again (graph/layout.h receipt_layout), so the attention's
// matmul copies it there as in the whole graph (it does not fold the batch dimensions). The
// replay took a received transposed slice for contiguous and the copy for one not made: the
// stage measured one copy per micro-batch in flight above it (interleaved, 2 ranks x 2 replicas:
// +49,152 B, 2.7%, at every ZeRO level).
TEST_CASE("a stage receiving a transposed slice of a fused projection measures its replay", "[import]") {
  at::set_num_threads(1);
  CountingAllocator& counter = CountingAllocator::install();
  const OpGraph g = build_imported(*read_model_file(test_model("codegen")), 4);
  const Profile profile = quick_profile(g);
  // Cut right after the first such tensor: the next stage receives it.
  int cut = -1;
  for (const TensorProfile& t : profile.tensors)
    if (t.relaid_on_receipt == 1 && t.alias_of >= 0 && !t.internal) {
      int root = t.id;
      while (profile.tensors[static_cast<size_t>(root)].alias_of >= 0)
        root = profile.tensors[static_cast<size_t>(root)].alias_of;
      if (profile.tensors[static_cast<size_t>(root)].bytes == t.bytes) continue;  // a permutation of all of it
      cut = t.producer + 1;
      break;
    }
  REQUIRE(cut > 0);
  for (ScheduleChoice kind : {ScheduleChoice::named("1f1b"), ScheduleChoice::named("zb-h1")}) {
    test::TwoStages two(profile, g.size(), cut, kind, /*steps=*/2);
    two.pc.evictions.assign(2, {});
    const StageProgram program = stage_program(two.model, cut, g.size(), 1, {});
    const int64_t predicted = replay_stage_program(two.model, program).peak;
    const int64_t measured = measured_stage_peak(counter, g, two.pc, 1);
    INFO(name_of(kind) << " cut " << cut << ": measured " << measured << " predicted " << predicted);
    CHECK(measured <= predicted);
    CHECK(double(measured) >= 0.97 * double(predicted));
  }
}

// Every block boundary and every eighth of the graph, every schedule, keeping every tensor and
// then swapping or recomputing at random: the stage's measured peak against the replay's
// prediction (below it by up to 5%: backward workspaces measured node by node). DEBUG_MEMORY=1
// prints every ratio.
TEST_CASE("the stage memory replay predicts imported stages' measured peaks", "[import]") {
  at::set_num_threads(1);
  CountingAllocator& counter = CountingAllocator::install();
  for (const char* name : {"gpt2", "bert", "t5", "llama", "gemma", "falcon", "gpt_bigcode", "gpt_neox", "gpt2_bf16",
                           "gpt2_fused", "gpt2_chunked", "opt", "gptj", "mixtral", "cohere"}) {
    const OpGraph g = build_imported(*read_model_file(test_model(name)), 4);
    const Profile profile = quick_profile(g);
    std::mt19937 rng(5);
    std::set<int> cuts = test::block_and_eighth_cuts(g, profile);
    // After a view of a data input (GPT-2's reshaped input ids): the next stage receives the
    // view and loads no data, so a decision to evict the data it saves through it changes
    // nothing; the first stage sends the view, so it empties the data only after the send (it
    // emptied it before and sent freed memory: a crash).
    std::set<int> after_data_views;
    for (int n = 1; n + 1 < g.size(); ++n) {
      const int alias = profile.tensors[static_cast<size_t>(g.nodes[static_cast<size_t>(n)].outputs[0])].alias_of;
      if (alias >= 0 && profile.tensors[static_cast<size_t>(alias)].is_data) after_data_views.insert(n + 1);
    }
    cuts.insert(after_data_views.begin(), after_data_views.end());
    // The first rotary sum (a query's), its halves received: the add hands its gradient itself
    // to both, a permuted view, which the transports sent as two copies (Qwen2 64 KiB above
    // under zb-h1) before one copy served both.
    for (int n = 2; n < g.size(); ++n)
      if (profile.nodes[static_cast<size_t>(n)].kind == "aten::add.Tensor" &&
          profile.nodes[static_cast<size_t>(n) - 2].kind == "aten::cat") {
        cuts.insert(n);
        break;
      }
    // The loss head alone after the last projection, its logits received: the loss's backward
    // is the stage's peak, and its workspace (the labels' masks and scales) measured 3,344 B
    // above on OPT's and Phi's interleaved last stages before the profiler took the gradient
    // the loss writes over its log-probabilities for a new buffer (workspace 0).
    for (int n = g.size() - 1; n > 0; --n)
      if (profile.nodes[static_cast<size_t>(n)].kind == "aten::linear") {
        cuts.insert(n + 1);
        break;
      }
    for (int cut : cuts)
      for (ScheduleChoice kind :
           {ScheduleChoice::named("gpipe"), ScheduleChoice::named("1f1b"), ScheduleChoice::named("async"),
            ScheduleChoice::named("zb-h1"), ScheduleChoice::named("zb-h2")})
        for (int round = 0; round < 2; ++round) {
          test::TwoStages two(profile, g.size(), cut, kind, /*steps=*/2);
          const CostModel& model = two.model;
          PipelineConfig& pc = two.pc;
          std::vector<StageProgram> programs;
          for (const auto& [b, e] : pc.ranges) {
            programs.push_back(stage_program(
                model, b, e, static_cast<int>(programs.size()),
                round == 0 ? std::vector<TensorDecision>{} : test::random_decisions(model, profile, b, e, rng)));
            pc.evictions.push_back(programs.back().evictions);
          }
          for (int x = 0; x < 2; ++x) {
            const int64_t predicted = replay_stage_program(model, programs[static_cast<size_t>(x)]).peak;
            int64_t measured = 0;
            try {
              measured = measured_stage_peak(counter, g, pc, x);
            } catch (const ConfigError& e) {  // a stage holding a tied embedding and its projection
              CHECK(kind.traits().splits_backward);
              CHECK_THAT(e.what(), Catch::Contains("cannot split its backward"));
              continue;
            }
            if (std::getenv("DEBUG_MEMORY"))
              std::fprintf(stderr, "%s %s cut %d round %d stage %d (%+.1f%%)\n", name, name_of(kind), cut, round, x,
                           100.0 * (double(measured) / double(predicted) - 1));
            INFO(name << " cut " << cut << " (" << g.nodes[static_cast<size_t>(cut)].name << ") " << name_of(kind)
                      << " round " << round << " stage " << x << ": measured " << measured << " predicted "
                      << predicted);
            // Never above, but for 1 KiB after a view of the data: a first stage that only views
            // the input ids and sends the view holds one micro-batch's ids (512 bytes) more or
            // less than the replay, whose moments of releasing data and sent views differ from
            // the stand-in transport's; T5 cut in its labels' shift (a received slice, cloned)
            // +952 B under gpipe (neither explained). Before: Cohere +8 KiB under zb-h1 and zb-h2
            // cut inside its rotary (a stack's gradient, whose halves autograd hands out as views
            // of one buffer, taken for two); Mixtral's first stage cut at its
            // first experts' zeros +2.0% under zb-h1 and zb-h2 (its hidden states, sent on and
            // read by the router through a view: the view's gradient summed into the received
            // one, a new buffer, taken for none); GPT-J up to
            // +3.8% on a stage receiving its attention's value, a permuted view that the stage
            // lays out again, so that the matmul copies it there too (the replay took the copy
            // for one a received tensor does not need); OPT up to +1.1% under zb-h1 and
            // zb-h2 (the residual's gradient a view of its reshape's, which autograd sums into
            // out of place, counted as a sum in place); every stage of the loss head
            // alone up to +848 B (its backward's workspace, counted 0: the profiler took the
            // gradient written over the log-probabilities for a new buffer); up to +0.3%, and
            // Gemma +1.2% at cut 69 (a sum of two linears' input gradients, each a view: a
            // buffer of its own, now counted); +2.0% and +3.4% before the stand-in transport
            // drew received gradients in place (BERT's loss alone on the second stage, GPT-2
            // cut after its first MLP projection, both under 1f1b); T5 evicting at random +5.1%
            // before its profile had the layouts of the kernels that run (see the test above);
            // BERT cut 54 +1.1% before a received gradient got its tensor's layout. A split
            // backward (zb-h1, zb-h2) measured up to 24% above before the replay's I held the
            // gradients a parameter's view gets (Falcon's transposed weights, a bf16 cast, a
            // chunked head's split) and let go of the log-probabilities no reader holds (an
            // imported head's reshape of the logits, a bf16 cast, received logits).
            CHECK(measured <= predicted + (after_data_views.count(cut) ? 1024 : 0));
            CHECK(double(measured) >= 0.93 * double(predicted) - 1024);
          }
        }
  }
}

// A stage of one concat of received tensors (the planner cut GPT-NeoX so, with measured times:
// its rotary halves) holds what its replay says. It measured up to 11% above: received permuted
// views are laid out again, a copy beside the received buffer; their gradients keep that layout
// and are sent as contiguous copies beside them; and I's gradients of received inputs, slices
// of the concat's, held the whole until their send.
TEST_CASE("a stage of one concat of received tensors measures its replay", "[import]") {
  at::set_num_threads(1);
  CountingAllocator& counter = CountingAllocator::install();
  for (const char* name : {"gpt_neox", "llama"}) {
    const OpGraph g = build_imported(*read_model_file(test_model(name)), 4);
    const Profile profile = quick_profile(g);
    int stages = 0;
    for (const Node& n : g.nodes) {
      if (node_class(profile.nodes[static_cast<size_t>(n.id)].kind) != NodeClass::Concat) continue;
      ++stages;
      for (const char* schedule : {"1f1b", "zb-h1", "zb-h2"}) {
        const ScheduleChoice kind = ScheduleChoice::named(schedule);
        PlanOptions po = test::TwoStages::plan_options(kind);
        po.stages = 3;
        const CostModel model(profile, po);
        PipelineConfig pc;
        pc.schedule = kind;
        pc.ranges = {{0, n.id}, {n.id, n.id + 1}, {n.id + 1, g.size()}};
        pc.micro_batches = 3;
        pc.steps = 2;
        pc.evictions.assign(3, {});  // keeping everything
        const int64_t predicted = replay_stage_program(model, stage_program(model, n.id, n.id + 1, 1, {})).peak;
        const int64_t measured = measured_stage_peak(counter, g, pc, 1);
        INFO(name << " " << n.name << " alone, " << schedule << ": measured " << measured << " predicted "
                  << predicted);
        CHECK(measured <= predicted);
        CHECK(double(measured) >= 0.97 * double(predicted));
      }
    }
    CHECK(stages > 0);
  }
}

// A residual add and an exported dropout (a clone) hand their output's gradient itself to their
// inputs, which the stage replay counts as one buffer with several holders; a product, a norm or
// a concat makes new gradients.
TEST_CASE("the profile says which nodes hand their output's gradient to their inputs", "[import]") {
  at::set_num_threads(1);
  const OpGraph g = build_imported(*read_model_file(test_model("gpt_neox")), 4);
  const Profile profile = quick_profile(g);
  int passing = 0;
  for (const NodeProfile& node : profile.nodes) {
    const bool tracked = std::any_of(g.nodes[static_cast<size_t>(node.id)].inputs.begin(),
                                     g.nodes[static_cast<size_t>(node.id)].inputs.end(),
                                     [&](int t) { return profile.tensors[static_cast<size_t>(t)].requires_grad == 1; });
    INFO(node.name << " " << node.kind);
    if (tracked && (node.kind == "aten::add.Tensor" || node.kind == "aten::clone")) {
      CHECK(node.passes_gradient);
      ++passing;
    }
    for (const char* makes_new : {"aten::linear", "aten::mul.Tensor", "aten::layer_norm", "aten::cat", "aten::neg"})
      if (node.kind == makes_new) CHECK_FALSE(node.passes_gradient);
  }
  CHECK(passing >= 10);  // two layers' residual adds, rotary sums and dropouts
}

// What `train` plans is what its ranks hold: the planner's own plans of imported GPT-2, GPT-NeoX
// and T5 (the loss head on the last stage) on 2 and 4 ranks, under the schedules with a split
// backward or several stages a rank, keeping everything and then (memopt sr) under the largest
// budget below that plan's largest stage (times the stages a rank) at which the plan swaps or
// recomputes; every rank, run alone through two steps, measures at most its predicted peak and
// at least 97% of it. DEBUG_MEMORY=1 prints them
// (docs/benchmarks.md). And GPT-2 with attention dropout, whose attention a split backward's I
// runs as several autograd functions.
TEST_CASE("planned imported pipelines measure at most their predicted rank peaks", "[import]") {
  at::set_num_threads(1);
  CountingAllocator& counter = CountingAllocator::install();
  // GPT-2 with attention dropout: on CPU its attention is several autograd functions, whose
  // saved tensors I keeps to its end (the node's I workspace, measured apart from its whole
  // backward's): the model measured 2-3% above its zb-h1 and zb-h2 predictions before.
  for (const char* name : {"gpt2", "gpt_neox", "t5", "gpt2_dropout"}) {
    const OpGraph g = build_imported(*read_model_file(test_model(name)), 4);
    // Times that do not vary from run to run (a node's bytes stand for its work), so that the
    // planner's cuts, and the stages measured, are the same in every run.
    Profile profile = quick_profile(g);
    for (NodeProfile& node : profile.nodes) {
      double bytes = static_cast<double>(node.param_bytes);
      for (int t : node.outputs) bytes += static_cast<double>(profile.tensors[static_cast<size_t>(t)].bytes);
      node.fwd_ms = node.recompute_ms = 1e-3 + 1e-6 * bytes / 1024;
      node.bwd_ms = 2 * node.fwd_ms;
      node.fwd_ms_fit = {node.fwd_ms, 0};
      node.bwd_ms_fit = {node.bwd_ms, 0};
    }
    // The optimizers' update, measured too, is charged at each stage's step end: fixed, as the
    // nodes' times (measured, it moved the cuts from run to run).
    profile.update_ms = UpdateTimes{0.05, 0.1, 0.1};
    for (const char* schedule : {"zb-h1", "zb-h2", "interleaved"})
      for (int ranks : {2, 4}) {
        int64_t kept_peak = 0;
        for (MemoptKind memopt : {MemoptKind::None, MemoptKind::SwapRecompute}) {
          PlanOptions po;
          po.schedule = ScheduleChoice::named(schedule);
          po.stages = ranks * po.schedule.virtual_stages();
          po.micro_batches = 2 * ranks;  // interleaved: a multiple of the ranks
          po.optimizer = OptimizerKind::Adam;
          po.memopt = memopt;
          po.fit_replayed = true;
          // The largest budget (in 1% steps below the kept plan's largest rank) whose plan evicts:
          // above it, the planner moves its cuts instead.
          auto evicts = [](const Plan& p) {
            return std::any_of(p.stages.begin(), p.stages.end(),
                               [](const StagePlan& s) { return !s.evictions.empty(); });
          };
          std::optional<Plan> found = memopt == MemoptKind::None ? try_plan(profile, po) : std::nullopt;
          for (int64_t percent = 99; memopt != MemoptKind::None && !found && percent >= 10; --percent) {
            po.capacity_bytes = kept_peak * percent / 100;
            found = try_plan(profile, po);
            if (found && !evicts(*found)) found.reset();
          }
          if (!found) {  // T5 under zb-h1: every budget that needs evictions is refused or infeasible
            REQUIRE(memopt != MemoptKind::None);
            WARN(name << " " << schedule << ": no budget gives a plan that evicts");
            continue;
          }
          const Plan& plan = *found;
          const std::vector<int64_t> predicted = plan.rank_peak_bytes(/*predicted=*/true);
          // Interleaved: each of a rank's V stages is planned within capacity / V.
          if (memopt == MemoptKind::None)
            for (const StagePlan& s : plan.stages)
              kept_peak = std::max(kept_peak, s.memory.predicted_peak() * po.schedule.virtual_stages());
          PipelineConfig pc = pipeline_config_of(plan, g);
          pc.steps = 2;
          int evictions = 0;
          for (const auto& stage : pc.evictions) evictions += static_cast<int>(stage.size());
          if (std::getenv("DEBUG_MEMORY"))
            for (const auto& [b, e] : pc.ranges) std::fprintf(stderr, "  [%d, %d)", b, e);
          for (int r = 0; r < ranks; ++r) {
            const int64_t measured = test::measured_rank_peak(counter, g, pc, r);
            const int64_t expected = predicted[static_cast<size_t>(r)];
            if (std::getenv("DEBUG_MEMORY"))
              std::fprintf(stderr, "%s %s %d ranks %s rank %d: predicted %lld measured %lld (%+.2f%%)\n", name,
                           schedule, ranks, name_of(memopt), r, static_cast<long long>(expected),
                           static_cast<long long>(measured), 100.0 * (double(measured) / double(expected) - 1));
            INFO(name << " " << schedule << " " << ranks << " ranks memopt " << name_of(memopt) << " (" << evictions
                      << " evictions) rank " << r << ": measured " << measured << " predicted " << expected);
            // (Ranks with the loss's stage measured 4 to 8 bytes above before the replay counted
            // the scaled loss, its seed gradient and the loss's gradient, which the backward
            // starts from: the test allowed interleaved ranks 16; and 4 to 28 bytes above once the
            // runtime held a step's losses until it read them together, commit fea121c, before
            // the replay held them too.)
            CHECK(measured <= expected);
            // At most 3% below, as the models (GPT-2, GPT-NeoX, T5) measure since the
            // replay counts one buffer for a gradient an add or a clone hands to several holders
            // (NodeProfile::passes_gradient), the profiler's whole backward no longer copies its
            // inputs' gradients into strided leaves, and a rotary embedding's concat hands out
            // slices (before: GPT-NeoX down to 5.7%, GPT-2 3.3%); and GPT-2 with attention
            // dropout since a whole backward is charged the workspace the profiler measures as
            // it lets the graph go (before: down to 6.8%, interleaved ranks).
            CHECK(double(measured) >= 0.97 * double(expected));
          }
        }
      }
  }
}

// Swapping and recomputing imported tensors changes nothing the model computes.
TEST_CASE("random swaps and recomputations of imported tensors train bitwise like keeping them", "[import]") {
  at::set_num_threads(1);
  for (const char* name : {"gpt2", "llama"}) {
    INFO(name);
    const OpGraph g = build_imported(*read_model_file(test_model(name)), 2);
    const Profile profile = quick_profile(g);
    PlanOptions po;
    po.stages = 2;
    po.schedule = ScheduleChoice::named("1f1b");
    po.micro_batches = 2;
    const CostModel model(profile, po);
    PipelineConfig pc;
    pc.schedule = ScheduleChoice::named("1f1b");
    pc.ranges = {{0, g.size() / 2}, {g.size() / 2, g.size()}};
    pc.micro_batches = 2;
    pc.steps = 2;
    pc.optimizer.kind = OptimizerKind::Adam;
    const InProcessResult kept = run_pipeline_in_process(g, pc);
    std::mt19937 rng(3);
    for (const auto& [b, e] : pc.ranges)
      pc.evictions.push_back(place_evictions(model, b, e, test::random_decisions(model, profile, b, e, rng)));
    const InProcessResult evicted = run_pipeline_in_process(g, pc);
    REQUIRE(kept.losses.size() == 2);
    REQUIRE(evicted.losses.size() == 2);
    for (size_t s = 0; s < 2; ++s) CHECK(kept.losses[s].loss == evicted.losses[s].loss);
    for (size_t x = 0; x < 2; ++x)
      for (size_t i = 0; i < kept.parameters[x].size(); ++i)
        CHECK(at::equal(kept.parameters[x][i].tensor, evicted.parameters[x][i].tensor));
  }
}

TEST_CASE("a stage run alone receives for real every tensor no parameter feeds", "[import][memory]") {
  // T5's relative-position buckets are floats (a logarithm of the distance) on their way to an
  // index: a stand-in's random values there indexed out of range when a cut fell inside them.
  const OpGraph g = build_imported(*read_model_file(test_model("t5")), 2);
  const std::vector<bool> tracked = g.requires_grad();
  int floating = 0;
  for (int b = 1; b < g.size(); ++b) {
    std::set<int> wanted;
    for (const CrossingTensor& c : g.crossing(b))
      if (!tracked[static_cast<size_t>(c.tensor)]) wanted.insert(c.tensor);
    if (wanted.empty()) continue;
    const std::map<int, at::Tensor> exact = exact_constant_inputs(g, b, 7);
    for (int t : wanted) {
      INFO("cut " << b << ", tensor " << g.tensor(t).name);
      REQUIRE(exact.count(t));
      floating += exact.at(t).is_floating_point();
    }
  }
  CHECK(floating > 0);  // the buckets' floats are among them
}
