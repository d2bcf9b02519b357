#include "runtime/pipeline.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <array>
#include <set>
#include <stdexcept>

#include "memory/device_memory.h"
#include "runtime/checkpoint.h"
#include "runtime/mpi_transport.h"
#include "runtime/mpi_wait.h"
#include "runtime/pipeline_reductions.h"
#include "runtime/pipeline_stage.h"
#include "runtime/replica_averager.h"
#include "runtime/stage_tracer.h"
#include "runtime/step_relay.h"
#include "runtime/transport.h"
#include "schedule/simulate.h"
#include "util/error.h"
#include "util/stop_request.h"

namespace dawnpiper {

PipelineConfig pipeline_config_of(const Plan& plan, const OpGraph& graph) {
  PipelineConfig pc;
  pc.schedule = plan.options.schedule;
  for (const StagePlan& s : plan.stages) {
    pc.ranges.push_back({s.begin, s.end});
    pc.evictions.push_back(s.evictions);
  }
  check_ranges(graph, pc.ranges);
  pc.micro_batches = plan.options.micro_batches;
  pc.optimizer.kind = plan.options.optimizer;
  return pc;
}

void check_ranges(const OpGraph& g, const std::vector<std::pair<int, int>>& ranges) {
  int expected = 0;
  for (const auto& [b, e] : ranges) {
    if (b != expected || e <= b)
      throw ConfigError("stage node ranges must tile the graph in order (got [" + std::to_string(b) + ", " +
                        std::to_string(e) + ") after node " + std::to_string(expected) + ")");
    expected = e;
  }
  if (expected != g.size())
    throw ConfigError("stage node ranges end at node " + std::to_string(expected) + " but the graph has " +
                      std::to_string(g.size()) + " nodes (a plan for another model?)");
}

int ranks_of(const PipelineConfig& c) { return static_cast<int>(c.ranges.size()) / c.schedule.virtual_stages(); }

std::vector<Action> rank_actions(const OpGraph& g, const PipelineConfig& c, int rank) {
  const int stages = static_cast<int>(c.ranges.size());
  // One schedule per stretch between drains: a synchronous step drains, async only every
  // drain_every steps (or never).
  const ScheduleTraits& traits = c.schedule.traits();
  const int64_t every = traits.drains_every_step ? 1 : c.drain_every;
  std::vector<Action> all;
  for (int64_t from = c.first_step; from < c.steps;) {
    const int64_t to = every > 0 ? std::min(c.steps, (from / every + 1) * every) : c.steps;
    const Schedule stretch = c.schedule.make(stages, (to - from) * c.micro_batches);
    for (Action a : stretch.actions.at(static_cast<size_t>(rank))) {
      if (a.micro_batch >= 0) a.micro_batch += from * c.micro_batches;
      all.push_back(a);
    }
    from = to;
  }
  std::set<int> holding_tied;
  const std::vector<int> tied_owner = g.tied_owners();
  for (int s = 0; s < stages; ++s)
    if (holds_tied_across(tied_owner, c.ranges[s].first, c.ranges[s].second)) holding_tied.insert(s);
  return add_tied_reductions(traits, std::move(all), holding_tied);
}

std::vector<Action> stage_actions(const OpGraph& g, const PipelineConfig& c, int stage) {
  std::vector<Action> mine;
  for (const Action& a : rank_actions(g, c, stage % ranks_of(c)))
    if (a.stage == stage) mine.push_back(a);
  return mine;
}

StageConfig stage_config(const OpGraph& g, const PipelineConfig& c, int stage) {
  StageConfig s;
  static_cast<StageSettings&>(s) = c;
  s.stages = static_cast<int>(c.ranges.size());
  const auto [begin, end] = c.ranges[static_cast<size_t>(stage)];
  s.program = stage_program(c.schedule.traits(), c.schedule.make(s.stages, c.micro_batches).stage_actions(stage),
                            g.tied_owners(), begin, end, stage,
                            static_cast<size_t>(stage) < c.evictions.size() ? c.evictions[static_cast<size_t>(stage)]
                                                                            : std::vector<Eviction>{});
  return s;
}

std::map<std::vector<int>, std::vector<std::string>> tied_across_stages(const OpGraph& g, const PipelineConfig& c) {
  std::map<std::vector<int>, std::vector<std::string>> names;
  for (const auto& [key, holders] : tied_groups(g, c))
    names[holders].push_back(g.nodes[key.first].name + "." + g.nodes[key.first].params[key.second].name);
  return names;
}

namespace {

// Where a list of actions ends a training step, for both drivers: a synchronous step ends with
// `updates_per_step` optimizer steps (a rank's V stages'; every stage's in one process); an
// asynchronous stage updates after every backward, and the update after a step's last
// micro-batch ends the step (there, at a drain, nothing is in flight).
class StepEnds {
 public:
  StepEnds(const PipelineConfig& c, int updates_per_step)
      : micro_batches_(c.micro_batches),
        per_step_(c.schedule.traits().updates_once_per_step),
        updates_per_step_(updates_per_step),
        step_(c.first_step) {}
  // Follows `a`; true where it ends step(). Fed every action of one rank, or of one stage under
  // async in one process.
  bool after(const Action& a) {
    if (a.micro_batch >= 0) step_ = a.micro_batch / micro_batches_, micro_batch_ = a.micro_batch;
    if (a.kind != ActionKind::OptimizerStep || ++updates_ % updates_per_step_ != 0) return false;
    return per_step_ || micro_batch_ % micro_batches_ == micro_batches_ - 1;
  }
  int64_t step() const { return step_; }  // of the latest action with a micro-batch (an update belongs to it)

 private:
  int64_t micro_batches_;
  bool per_step_;
  int updates_per_step_;
  int64_t step_, micro_batch_ = -1, updates_ = 0;
};

}  // namespace

InProcessResult run_pipeline_in_process(const OpGraph& g, const PipelineConfig& c,
                                        const std::function<void(const StepReport&)>& on_step) {
  check_ranges(g, c.ranges);
  const int stages = static_cast<int>(c.ranges.size());
  LocalTransport transport;
  std::vector<std::unique_ptr<PipelineStage>> stage;
  InProcessResult result;
  for (int s = 0; s < stages; ++s) {
    stage.push_back(std::make_unique<PipelineStage>(g, stage_config(g, c, s), transport));
    stage.back()->set_loss_callback([&](int64_t step, double loss) {
      StepReport r;
      r.step = step;
      r.loss = loss;
      r.lr = scheduled_lr(c.optimizer.lr, c.optimizer.schedule, step);
      r.grad_norm = std::numeric_limits<double>::quiet_NaN();
      result.losses.push_back(r);
    });
  }
  // The same reductions as the MPI run's, with every stage here (pipeline_reductions.h).
  const std::vector<TieComm> tie_comms = tie_communicators(g, c, MPI_COMM_NULL, 0);
  attach_reducers(stage, tie_comms, c, MPI_COMM_NULL, std::make_shared<std::pair<int, double>>(0, 0.0));
  Schedule schedule;
  schedule.name = c.schedule.name();
  schedule.stages = stages;
  schedule.micro_batches = c.steps * c.micro_batches;
  schedule.sends_in_flight = c.schedule.traits().sends_in_flight;
  for (int r = 0; r < ranks_of(c); ++r) schedule.actions.push_back(rank_actions(g, c, r));
  // Synchronous schedules: a stage's tied sums and update end its step, and in one process they
  // wait until every stage has reached them (the ranks' collectives wait for each other so):
  // every tied sum first, then the updates.
  const bool once_per_step = c.schedule.traits().updates_once_per_step;
  std::vector<Action> deferred;
  auto run_deferred = [&] {
    for (const Action& a : deferred)
      if (a.kind == ActionKind::ReduceTiedGrads) stage[a.stage]->execute(a);
    for (const Action& a : deferred)
      if (a.kind == ActionKind::OptimizerStep) stage[a.stage]->execute(a);
    if (!result.losses.empty()) result.losses.back().grad_norm = stage.front()->last_grad_norm();
    deferred.clear();
  };
  // Losses of steps every stage has finished go to on_step (the last stage computes a step's
  // loss before the earlier stages' backwards of it have run).
  size_t reported = 0;
  auto report_finished_steps = [&] {
    if (!on_step || reported == result.losses.size()) return;
    synchronize(c.device);
    while (reported < result.losses.size()) on_step(result.losses[reported++]);
  };
  // A synchronous step ends with every stage's update; async's with stage 0's after the step's
  // last micro-batch.
  StepEnds ends(c, once_per_step ? stages : 1);
  for (const Action& a : simulate_global(schedule)) {
    transport.set_sender(a.stage);
    const bool deferred_here =
        once_per_step && (a.kind == ActionKind::ReduceTiedGrads || a.kind == ActionKind::OptimizerStep);
    if (deferred_here)
      deferred.push_back(a);
    else
      stage[a.stage]->execute(a);
    if ((once_per_step || a.stage == 0) && ends.after(a)) {
      if (deferred_here) run_deferred();
      report_finished_steps();
    }
  }
  if (!deferred.empty()) run_deferred();
  report_finished_steps();
  for (auto& s : stage) result.parameters.push_back(s->module().parameters());
  return result;
}

std::map<int, at::Tensor> exact_constant_inputs(const OpGraph& g, int begin, uint64_t seed) {
  at::NoGradGuard no_grad;
  std::set<int> wanted, nodes;
  const std::vector<bool> tracked = g.requires_grad();  // what a parameter or input feeds
  for (const CrossingTensor& c : g.crossing(begin))
    if (!is_floating(g.tensor(c.tensor).dtype) || !tracked[static_cast<size_t>(c.tensor)]) wanted.insert(c.tensor);
  std::vector<int> stack(wanted.begin(), wanted.end());
  while (!stack.empty()) {  // the nodes they depend on
    const int n = g.tensor(stack.back()).producer;
    stack.pop_back();
    if (!nodes.insert(n).second) continue;
    for (int in : g.nodes[static_cast<size_t>(n)].inputs) stack.push_back(in);
  }
  TensorEnv env(g.tensors.size());
  SyntheticData data(g, seed);
  std::vector<int> inputs;
  for (int n : nodes)
    if (g.nodes[static_cast<size_t>(n)].kind == OpKind::Input)
      inputs.push_back(g.nodes[static_cast<size_t>(n)].outputs[0]);
  data.load(env, inputs, 0, at::Device(at::kCPU));
  for (int n : nodes)  // ascending: execution order; each node alone holds only its parameters
    if (g.nodes[static_cast<size_t>(n)].kind != OpKind::Input)
      StageModule(g, n, n + 1, seed).run_node(n, env, RunContext{});
  std::map<int, at::Tensor> out;
  for (int t : wanted) out[t] = env[static_cast<size_t>(t)].clone();
  return out;
}

namespace {

// The mean loss of options.eval_batches validation micro-batches, on every rank (collective over
// the pipeline). Message ids from `first_id` on, apart from every training micro-batch's.
double validation_loss(RankStages& stages, const PipelineConfig& c, const RunConfig& options, MPI_Comm comm,
                       int64_t first_id) {
  double sum = 0;
  for (int64_t k = 0; k < options.eval_batches; ++k)
    for (auto& stage : stages) sum += stage->evaluate(first_id + k, k);
  double mean = sum / static_cast<double>(options.eval_batches);
  broadcast_quietly(&mean, 1, MPI_DOUBLE, ranks_of(c) - 1, comm);
  return mean;
}

// Whether a stop signal reached any rank (collective over the pipeline and its replicas): the
// signal, the same on every rank, or 0.
int agreed_stop_signal(const RunConfig& options, MPI_Comm comm) {
  int signal = stop_signal();
  allreduce_quietly(&signal, 1, MPI_INT, MPI_MAX, comm);
  if (options.replica_comm != MPI_COMM_NULL) allreduce_quietly(&signal, 1, MPI_INT, MPI_MAX, options.replica_comm);
  return signal;
}

// ZeRO level 3: every parameter gathered whole (collective over the replicas), or let go again.
void gather_parameters(RankStages& stages) {
  for (auto& stage : stages)
    if (ZeroShard* zero = stage->zero_shard()) zero->gather_all();
}
void release_parameters(RankStages& stages) {
  for (auto& stage : stages)
    if (ZeroShard* zero = stage->zero_shard()) zero->release_all();
}

// After the optimizer steps that end a training step: the validation loss every eval_every steps,
// whether a stop signal ends the run here (where the ranks can stop: after every step of a
// synchronous schedule, at async's drains), and a checkpoint every checkpoint_every steps, after
// the last and where the run stops. Returns the stop signal, or 0.
int after_step(RankStages& stages, Transport& transport, const PipelineConfig& c, const RunConfig& options,
               const CheckpointIdentity& identity, MPI_Comm comm, int rank, int64_t step, StepRelay& relay) {
  if (options.eval_every > 0 && (step + 1) % options.eval_every == 0) {
    const int64_t evaluation = (step + 1) / options.eval_every;  // 1, 2, ...; 0: --eval-only's
    const double mean =
        validation_loss(stages, c, options, comm, (c.steps + evaluation * options.eval_batches) * c.micro_batches);
    relay.poll(step);  // the step's report comes first
    if (rank == 0 && options.on_validation) options.on_validation({step, mean});
  }
  const int64_t done = step + 1;
  const bool can_stop = c.schedule.traits().drains_every_step || (c.drain_every > 0 && done % c.drain_every == 0);
  const int stop = options.stop_on_signal && can_stop && done < c.steps ? agreed_stop_signal(options, comm) : 0;
  // Once per stage (the replicas hold the same weights), and under ZeRO each replica its shard.
  const bool sharded = c.zero_stage > 0 && c.replicas > 1;
  if ((c.replica == 0 || sharded) && !options.checkpoint_dir.empty()) {
    // The last step always: a directory given for checkpoints gets one, --checkpoint-every or not.
    const bool due = done == c.steps || (options.checkpoint_every > 0 && done % options.checkpoint_every == 0);
    if (due || stop) {
      transport.flush();
      std::vector<PipelineStage*> mine;
      for (auto& stage : stages) mine.push_back(stage.get());
      gather_parameters(stages);  // level 3: the checkpoint holds them whole
      write_checkpoint(options.checkpoint_dir, done, mine, identity, comm,
                       sharded ? options.replica_comm : MPI_COMM_NULL, options.keep_checkpoints);
      release_parameters(stages);
    }
  }
  return stop;
}

// Its parameters and optimizer are a stage's first allocations: where they do not fit (ranks
// sharing a GPU), the message names the stage.
std::unique_ptr<PipelineStage> build_stage(const OpGraph& g, const PipelineConfig& c, Transport& transport, int stage) {
  try {
    return std::make_unique<PipelineStage>(g, stage_config(g, c, stage), transport);
  } catch (const c10::OutOfMemoryError& e) {
    throw OutOfMemoryError("stage " + std::to_string(stage) + " (nodes [" + std::to_string(c.ranges[stage].first) +
                           ", " + std::to_string(c.ranges[stage].second) +
                           ")), building its parameters: " + e.what_without_backtrace());
  }
}

// This rank's stages: built, sharded over their replicas (ZeRO), and where the run resumes, read
// from the checkpoint.
RankStages rank_stages(const OpGraph& g, const PipelineConfig& c, Transport& transport, const RunConfig& options,
                       const CheckpointIdentity& identity, int rank) {
  const int ranks = ranks_of(c), virtual_stages = c.schedule.virtual_stages();
  RankStages stages;
  for (int v = 0; v < virtual_stages; ++v) stages.push_back(build_stage(g, c, transport, v * ranks + rank));
  if (c.zero_stage > 0 && c.replicas > 1) {
    const auto tied = tied_groups(g, c);  // level 2 reduce-scatters them once their sum is there
    for (auto& stage : stages) {
      std::vector<bool> deferred;
      for (const StageParameter& p : stage->module().parameters())
        deferred.push_back(tied.count({p.node, p.index}) > 0);
      stage->shard_optimizer(options.replica_comm, c.bucket_bytes, c.zero_stage, std::move(deferred));
    }
  }
  if (options.resume) {
    gather_parameters(stages);  // level 3: read whole, then each replica keeps its shard
    for (auto& stage : stages) read_checkpoint(options.checkpoint_dir, c.first_step, *stage, identity);
    for (auto& stage : stages)
      if (ZeroShard* zero = stage->zero_shard()) zero->keep_parameters();
    release_parameters(stages);
  }
  return stages;
}

// How the rank's gradients travel between replicas, for the run's transport line.
std::string replica_traffic(const PipelineConfig& c, Precision precision, const RankStages& stages,
                            const std::vector<std::unique_ptr<ReplicaAverager>>& averagers) {
  std::string said;
  if (c.replicas > 1 && c.zero_stage > 0)
    said += ", ZeRO level " + std::to_string(c.zero_stage) + " over " + std::to_string(c.replicas) +
            " replicas (gradients reduce-scattered" +
            (c.zero_stage >= 2 ? std::string(" as each micro-batch's backward produces them") : std::string()) +
            (c.zero_stage >= 3 ? std::string(", parameters gathered where they are read")
                               : std::string(", parameters all-gathered")) +
            (precision == Precision::Bf16 ? " in bf16" : "") + " by " + stages.front()->zero_shard()->collectives() +
            (stages.front()->zero_shard()->staged() ? " through host memory)" : ")");
  else if (!averagers.empty())
    said +=
        ", gradients averaged over " + std::to_string(c.replicas) + " replicas by " + averagers.front()->description();
  return said;
}

// Builds and runs this rank's stages: its action list, the losses sent to rank 0, validation and
// checkpoints.
StageRun run_stage(const OpGraph& g, const PipelineConfig& c, MPI_Comm comm, MPI_Comm data_comm, MPI_Comm control_comm,
                   const RunConfig& options, int rank) {
  StageRun result;
  result.next_step = c.steps;
  const int ranks = ranks_of(c), virtual_stages = c.schedule.virtual_stages();
  const CheckpointIdentity identity{options.preset, name_of(c.optimizer.kind), g.size(),
                                    static_cast<int64_t>(c.ranges.size())};
  PipelineTransport link = make_pipeline_transport(data_comm, c.device, options.transport,
                                                   LinkNeeds{virtual_stages > 1, c.schedule.traits().sends_in_flight});
  RoundRobinTransport round_robin(*link.transport, ranks, virtual_stages);
  Transport& transport = virtual_stages > 1 ? static_cast<Transport&>(round_robin) : *link.transport;
  result.transport = link.description;
  RankStages stages = rank_stages(g, c, transport, options, identity, rank);
  std::vector<TieComm> tie_comms = tie_communicators(g, c, comm, rank);
  StageTracer* tracing = nullptr;  // set once the tracer exists
  std::vector<std::unique_ptr<ReplicaAverager>> averagers;
  for (auto& stage : stages)
    if (c.replicas > 1) averagers.push_back(attach_replica_averager(*stage, c, options, tracing));
  result.transport += replica_traffic(c, g.precision, stages, averagers);
  attach_reducers(stages, tie_comms, c, comm, std::make_shared<std::pair<int, double>>(0, 0.0));
  StepRelay relay(c, options, control_comm, rank, ranks);
  double step_loss = 0;  // the last stage's, of the latest finished step
  stages.back()->set_loss_callback([&](int64_t, double loss) { step_loss = loss; });
  barrier_quietly(comm);  // every rank arrives without spinning...
  MPI_Barrier(comm);      // ...and leaves at once: the common origin of every rank's trace times
  StageTracer tracer(c.device, transport, StageTracer::Clock::now(), options.trace);
  tracing = &tracer;
  for (auto& stage : stages)
    if (stage->evictor())
      stage->evictor()->set_listener(
          [&tracer, x = stage->config().program.stage](
              ActionKind kind, int64_t mb, int tensor, int64_t bytes, StageTracer::Clock::time_point start,
              StageTracer::Clock::time_point end) { tracer.record_nested(x, kind, mb, tensor, bytes, start, end); });
  StepEnds ends(c, virtual_stages);  // the rank's updates, one per stage, end a synchronous step
  for (const Action& a : rank_actions(g, c, rank)) {
    const bool step_ended = ends.after(a);
    const int64_t step = ends.step();
    tracer.run(a, step, [&] { stages[static_cast<size_t>(a.stage / ranks)]->execute(a); });
    relay.poll();
    if (step_ended) {
      relay.send(step, tracer.take_step_peak(), step_loss, stages.front()->last_grad_norm());
      result.stop_signal = after_step(stages, transport, c, options, identity, comm, rank, step, relay);
      if (result.stop_signal) {  // every rank stops after this step: none has begun the next
        result.next_step = step + 1;
        break;
      }
    }
  }
  if (options.eval_only) {
    const double mean = validation_loss(stages, c, options, comm, c.steps * c.micro_batches);
    // Reported as after step first_step - 1, as a validation after training step k is.
    if (rank == 0 && options.on_validation) options.on_validation({c.first_step - 1, mean});
  }
  transport.flush();
  relay.finish(result.next_step);
  for (TieComm& tie : tie_comms) MPI_Comm_free(&tie.comm);
  for (auto& stage : stages)
    if (ZeroShard* zero = stage->zero_shard()) result.gathered_bytes += zero->take_gathered_bytes();
  gather_parameters(stages);  // what the run returns is whole
  for (auto& stage : stages)
    for (const StageParameter& p : stage->module().parameters()) result.parameters.push_back(p);
  for (auto& stage : stages)
    for (const at::Tensor& t : stage->optimizer().state())
      if (t.defined()) result.optimizer_state_bytes += static_cast<int64_t>(t.nbytes());
  result.actions = tracer.records();
  for (ActionRecord& r : result.actions) r.replica = c.replica;
  result.peak_bytes = tracer.peak_bytes();
  result.wall_s = tracer.last_end_s();
  return result;
}

}  // namespace

StageRun run_pipeline_mpi(const OpGraph& g, const PipelineConfig& c, MPI_Comm comm, const RunConfig& options) {
  check_ranges(g, c.ranges);
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (size != ranks_of(c))
    throw ConfigError(std::to_string(c.ranges.size()) + " stages need " + std::to_string(ranks_of(c)) +
                      " MPI ranks, not " + std::to_string(size));
  if (!c.schedule.traits().drains_every_step && options.checkpoint_every > 0 &&
      c.drain_every != options.checkpoint_every)
    throw std::logic_error("async checkpoints need the pipeline to drain where they are written (drain_every)");
  if ((options.checkpoint_every > 0 || options.resume) && options.checkpoint_dir.empty())
    throw ConfigError("--checkpoint-dir is required for checkpoints");
  MPI_Comm data_comm, control_comm;
  MPI_Comm_dup(comm, &data_comm);
  MPI_Comm_dup(comm, &control_comm);  // loss reports, apart from activation traffic
  StageRun result = run_stage(g, c, comm, data_comm, control_comm, options, rank);
  MPI_Comm_free(&data_comm);
  MPI_Comm_free(&control_comm);
  return result;
}

}  // namespace dawnpiper
