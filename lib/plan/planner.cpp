#include "plan/planner.h"

#include <algorithm>
#include <sched.h>

#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "plan/baselines.h"
#include "plan/bipar.h"
#include "plan/cost_model.h"
#include "plan/stage_evaluator.h"
#include "plan/stage_memory.h"
#include "plan/stage_program.h"
#include "plan/zero_baseline.h"
#include "util/error.h"
#include "util/units.h"
#include "util/stopwatch.h"

namespace dawnpiper {

namespace {

void validate(const Profile& profile, const PlanOptions& options) {
  if (is_zero_baseline(options.planner))
    throw ConfigError(std::string("--planner ") + name_of(options.planner) +
                      " is ZeRO's data-parallel baseline, no pipeline plan: `dawnpiper plan` computes it "
                      "(plan/zero_baseline.h); train pipelines with dawnpiper, gpipe, pipedream, vpipe, even or exact");
  if (options.stages < 1) throw ConfigError("the number of stages must be at least 1");
  const int v = options.schedule.virtual_stages();
  if (options.stages > profile.size())
    throw ConfigError(
        "cannot split " + std::to_string(profile.size()) + " nodes into " + std::to_string(options.stages) + " stages" +
        (v > 1 ? " (" + std::to_string(options.stages / v) + " ranks x --virtual-stages " + std::to_string(v) + ")"
               : ""));
  if (options.capacity_bytes <= 0) throw ConfigError("device memory capacity must be positive");
}

bool has_batch_fits(const Profile& profile) {
  for (const TensorProfile& t : profile.tensors)
    if (t.bytes_fit.base != 0 || t.bytes_fit.per_sample != 0) return true;
  for (const NodeProfile& n : profile.nodes)
    if (n.fwd_ms_fit.per_sample != 0 || n.bwd_ms_fit.per_sample != 0) return true;
  return false;
}

std::string capacity_text(int64_t bytes) {
  if (bytes == kUnlimitedBytes) return "unlimited memory";
  return format_bytes(static_cast<double>(bytes)) + " (" + std::to_string(bytes) + " bytes)";
}

// The smallest capacity with which the planner finds a plan at this micro-batch size, to a
// relative precision of 1/2000 (every answer is verified by planning).
int64_t needed_capacity(const Profile& profile, const PlanOptions& options) {
  PlanOptions o = options;
  o.capacity_bytes = kUnlimitedBytes;
  std::optional<Plan> open = try_plan(profile, o);
  if (!open) return INT64_MAX;  // cannot happen: without a limit every stage fits
  int64_t hi = std::max<int64_t>(1, open->max_peak_bytes());
  o.capacity_bytes = hi;
  while (!try_plan(profile, o)) {  // a heuristic search need not be monotone in capacity
    if (hi > INT64_MAX / 2) return INT64_MAX;
    hi *= 2;
    o.capacity_bytes = hi;
  }
  int64_t lo = std::min(options.capacity_bytes, hi - 1);  // known (or assumed) infeasible
  while (hi - lo > std::max<int64_t>(1, hi / 2000)) {
    int64_t mid = lo + (hi - lo) / 2;
    o.capacity_bytes = mid;
    if (try_plan(profile, o))
      hi = mid;
    else
      lo = mid;
  }
  return hi;
}

// A plan that find_max_batch no longer needs is stopped (StageEvaluator::set_stop) through
// this flag of the thread planning it; its result is then dropped.
thread_local const std::atomic<bool>* planning_stop = nullptr;
bool planning_stopped() { return planning_stop != nullptr && planning_stop->load(std::memory_order_relaxed); }

// The max-batch search as a function of the sizes' results: doubling until a size fails, then
// bisection, then on above the answer until kMisses sizes in a row fail. `known(b)` is whether
// size b fits, or nothing where that is not known yet; the step returns the answer (0: not even
// size 1 fits) or the first size whose result it needs. The search itself is sequential; the
// threads below only decide sizes before it asks for them.
struct SearchStep {
  std::optional<int64_t> answer;
  int64_t needs = 0;
  bool likely_fits = true;  // the outcome to plan ahead for first: sizes above the bisection's answer mostly fail
};

template <typename Known>
SearchStep max_batch_step(const Known& known, int64_t upper_bound) {
  auto ask = [&](int64_t b, bool& fits) {
    const std::optional<bool> r = known(b);
    if (r) fits = *r;
    return r.has_value();
  };
  bool fits = false;
  if (!ask(1, fits)) return {std::nullopt, 1};
  if (!fits) return {int64_t{0}, 0};
  int64_t lo = 1, hi = -1;            // lo fits; hi (when known) does not
  int64_t ceiling = upper_bound + 1;  // the first doubling that did not fit
  for (int64_t b = 2; hi < 0; b *= 2) {
    const int64_t probe = std::min(b, upper_bound);
    if (probe <= lo) break;  // lo == upper_bound
    if (!ask(probe, fits)) return {std::nullopt, probe};
    if (!fits) {
      hi = ceiling = probe;
    } else {
      lo = probe;
      if (probe == upper_bound) break;
    }
  }
  while (hi > 0 && hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (!ask(mid, fits)) return {std::nullopt, mid};
    (fits ? lo : hi) = mid;
  }
  // The search is a heuristic and need not be monotone in the micro-batch size (the candidate
  // cuts move with it: gpt2-tiny, async, r, 3 MiB: 5 fits, 6 does not, 7 does). Probe on above
  // the bisection's answer until kMisses sizes in a row do not fit.
  constexpr int64_t kMisses = 4;
  for (int64_t b = lo + 1, misses = 0; b < ceiling && misses < kMisses; ++b) {
    if (!ask(b, fits)) return {std::nullopt, b, false};
    if (fits)
      lo = b, misses = 0;
    else
      ++misses;
  }
  return {lo, 0};
}

// Plans at micro-batch sizes on up to `threads` threads, each size as soon as a thread is free:
// the one the search needs now, then those it may need next, breadth first over the results
// not known yet (both outcomes of the first, then of the next, ...). A plan whose size the
// search can no longer ask for is stopped. The search decides exactly as with one thread.
class BatchProbes {
 public:
  BatchProbes(const Profile& profile, const PlanAtBatch& plan_at, int64_t upper_bound, int threads)
      : profile_(profile), plan_at_(plan_at), upper_bound_(upper_bound), threads_(std::max(1, threads)) {}
  BatchProbes(const BatchProbes&) = delete;
  BatchProbes& operator=(const BatchProbes&) = delete;
  ~BatchProbes() {
    for (auto& [b, task] : running_) task.stop = true;
    for (auto& [b, task] : running_) task.thread.join();
  }

  std::optional<MaxBatch> run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      reap(lock);
      const SearchStep step = max_batch_step([this](int64_t b) { return known(b); }, upper_bound_);
      if (step.answer) {
        if (*step.answer == 0) return std::nullopt;
        return MaxBatch{*step.answer, *known_.at(*step.answer)};
      }
      // A size that failed to plan fails the search only once the search asks for it.
      if (auto failed = errors_.find(step.needs); failed != errors_.end()) std::rethrow_exception(failed->second);
      const std::vector<int64_t> wanted = candidates(threads_);
      for (auto& [b, task] : running_)
        if (std::find(wanted.begin(), wanted.end(), b) == wanted.end()) task.stop = true;
      for (int64_t b : wanted)
        if (static_cast<int>(running_.size()) < threads_ && running_.count(b) == 0 && errors_.count(b) == 0) start(b);
      changed_.wait(lock, [this] { return !finished_.empty(); });
    }
  }

 private:
  struct Task {  // in running_, whose nodes do not move: the thread reads `stop` where it is
    std::atomic<bool> stop{false};
    std::thread thread;
  };
  struct Result {
    std::optional<Plan> plan;
    std::exception_ptr error;
    bool stopped = false;
  };

  std::optional<bool> known(int64_t b) const {
    auto found = known_.find(b);
    if (found == known_.end()) return std::nullopt;
    return found->second.has_value();
  }

  // The sizes the search may ask for next, at most `count`: its next size, then breadth first
  // over both outcomes of each unknown result, the likelier first (a few dozen replays of the
  // search; no planning).
  std::vector<int64_t> candidates(int count) const {
    std::vector<int64_t> out;
    std::deque<std::map<int64_t, bool>> branches(1);
    for (int visited = 0; !branches.empty() && static_cast<int>(out.size()) < count && visited < 64; ++visited) {
      std::map<int64_t, bool> assumed = std::move(branches.front());
      branches.pop_front();
      const SearchStep step = max_batch_step(
          [&](int64_t b) -> std::optional<bool> {
            if (std::optional<bool> r = known(b)) return r;
            auto found = assumed.find(b);
            if (found == assumed.end()) return std::nullopt;
            return found->second;
          },
          upper_bound_);
      if (step.answer) continue;
      if (std::find(out.begin(), out.end(), step.needs) == out.end()) out.push_back(step.needs);
      for (bool fits : {step.likely_fits, !step.likely_fits}) {
        branches.push_back(assumed);
        branches.back()[step.needs] = fits;
      }
    }
    return out;
  }

  void start(int64_t b) {
    Task& task = running_[b];
    const std::atomic<bool>* stop = &task.stop;
    try {
      task.thread = std::thread([this, b, stop] { plan(b, stop); });
    } catch (...) {
      running_.erase(b);  // no thread to join
      throw;
    }
  }

  // On its own thread: size b's plan, given up once *stop is set.
  void plan(int64_t b, const std::atomic<bool>* stop) {
    Result result;
    planning_stop = stop;
    try {
      result.plan = plan_at_(profile_.at_batch(b));
    } catch (...) {
      result.error = std::current_exception();
    }
    result.stopped = stop->load();
    std::lock_guard<std::mutex> lock(mutex_);
    finished_.emplace_back(b, std::move(result));
    changed_.notify_one();
  }

  // Joins the threads that finished and keeps their results and errors (not those of stopped
  // plans). `lock` holds mutex_, which the threads need to finish: released while joining.
  void reap(std::unique_lock<std::mutex>& lock) {
    while (!finished_.empty()) {
      auto [b, result] = std::move(finished_.back());
      finished_.pop_back();
      auto task = running_.find(b);
      lock.unlock();
      task->second.thread.join();
      lock.lock();
      running_.erase(task);
      if (result.stopped) continue;
      if (result.error)
        errors_.emplace(b, result.error);
      else
        known_.emplace(b, std::move(result.plan));
    }
  }

  const Profile& profile_;
  const PlanAtBatch& plan_at_;
  const int64_t upper_bound_;
  const int threads_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<int64_t, std::optional<Plan>> known_;
  std::map<int64_t, std::exception_ptr> errors_;
  std::map<int64_t, Task> running_;
  std::vector<std::pair<int64_t, Result>> finished_;
};

// The cores this process may run on (a Slurm or mpirun binding restricts them), at most 8:
// seven threads already look three bisection levels ahead, and each one holds a plan.
int usable_cores() {
  cpu_set_t set;
  const int cores = sched_getaffinity(0, sizeof(set), &set) == 0
                        ? CPU_COUNT(&set)
                        : static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores, 1, 8);
}

std::optional<MaxBatch> max_batch(const Profile& profile, const PlanOptions& options, int64_t upper_bound,
                                  int threads) {
  const PlanAtBatch plan_at = [&](const Profile& at) { return try_plan(at, options); };
  return BatchProbes(profile, plan_at, upper_bound, threads).run();
}

// What a capacity is of: a stage, or a rank of several (interleaved) stages.
std::string per_device(const PlanOptions& options) {
  return options.schedule.virtual_stages() > 1 ? " per rank" : " per stage";
}

std::string describe(const Profile& profile, const PlanOptions& options) {
  std::string model = profile.preset.empty() ? profile.model : profile.preset;
  return std::string("planner '") + name_of(options.planner) + "' found no plan for " +
         (model.empty() ? std::string("the model") : model) + " on " + std::to_string(options.stages) +
         " stages (schedule " + name_of(options.schedule) + ", " + std::to_string(options.micro_batches) +
         " micro-batches of " + std::to_string(profile.micro_batch_size) + ", optimizer " + name_of(options.optimizer) +
         ", memopt " + name_of(options.memopt) + ") within " + capacity_text(options.capacity_bytes) +
         per_device(options);
}

// The node that needs the most by itself (CostModel::memory_floor of it alone, on the stage
// where that is least): where the capacity is below that, it is what makes the request
// infeasible, whatever the partition. Empty otherwise.
std::string node_needs_text(const Profile& profile, const PlanOptions& options) {
  const CostModel model(profile, options);
  int worst = -1, worst_stage = 0;
  int64_t need = 0;
  for (int i = 0; i < model.size(); ++i) {
    int64_t least = INT64_MAX;
    int at = 0;
    for (int x = 0; x < options.stages; ++x) {
      const int64_t floor = model.memory_floor(i, i + 1, x, /*evictable=*/true);
      if (floor < least) least = floor, at = x;
    }
    if (least > need) need = least, worst = i, worst_stage = at;
  }
  if (worst < 0 || need <= options.capacity_bytes) return "";
  const NodeProfile& node = profile.nodes[static_cast<size_t>(worst)];
  const MemoryBreakdown m = model.memory(worst, worst + 1, worst_stage, 0);
  auto bytes = [](int64_t b) { return format_bytes(static_cast<double>(b)); };
  // memory_floor is the larger of two sums; name the parts of the one that sets it.
  const int64_t forward = model.forward_need_bytes(worst, worst + 1);
  const int64_t held = m.weights + m.stashed_weights + m.gradients + m.optimizer;
  std::string text =
      "; node " + node.name + " (" + node.kind + ") alone needs at least " + bytes(need) + " on any stage: ";
  if (m.total() >= m.weights + m.optimizer + m.constants + m.runtime + forward) {
    text += "its parameters (" + bytes(m.weights) + ") with their gradients, stashed versions and optimizer state " +
            bytes(held);
    if (m.transient > 0) text += ", its largest workspace " + bytes(m.transient);
  } else {
    text += "its forward's inputs, outputs and workspace " + bytes(forward);
    if (m.weights > 0) text += " besides its parameters with their optimizer state " + bytes(m.weights + m.optimizer);
  }
  if (m.constants > 0) text += ", constants " + bytes(m.constants);
  if (m.runtime > 0) text += ", the device runtime's own " + bytes(m.runtime);
  return text;
}

std::string needs_text(const Profile& profile, const PlanOptions& options) {
  return "; it needs at least " + capacity_text(needed_capacity(profile, options)) + per_device(options) +
         " at micro-batch size " + std::to_string(profile.micro_batch_size);
}

}  // namespace

namespace {

// DawnPiper's cuts: the block search and BiPar judged by the tensor-level evaluator, late swaps
// where nothing fits, and the exact DP where there is nothing to evict. Empty: none found.
Bounds dawnpiper_bounds(const CostModel& model, StageEvaluator& evaluator, const PlanOptions& options) {
  Bounds bounds;
  // Two candidates. Cuts at block boundaries refined by Kernighan-Lin moves (vPipe's search),
  // judged by the same tensor-level evaluator: BiPar's sweeps assume feasibility is monotone
  // in a stage's range, which the replayed peak is not (more recomputation holds more re-run
  // buffers), so they can miss splits this local search finds. It is cheap, so it goes
  // first, and BiPar searches only for something faster (its sweeps prune by that time).
  // BiPar may make `if_found` / `if_none` evaluations (-1: no limit), as the block search
  // found a plan or not. The limit holds for BiPar only.
  auto block_then_bipar = [&](bool any, int64_t if_found, int64_t if_none) {
    bounds = static_cast<int>(block_boundaries(model).size()) > options.stages ? vpipe_partition(evaluator) : Bounds{};
    const int64_t n = bounds.empty() ? if_none : if_found;
    evaluator.set_evaluation_limit(n < 0 ? -1 : evaluator.evaluations() + n);
    const double cutoff = bounds.empty() ? std::numeric_limits<double>::infinity() : evaluator.objective(bounds);
    const Bounds bipar = BiPar(evaluator).solve(cutoff, any);
    evaluator.set_evaluation_limit(-1);
    if (!bipar.empty()) bounds = bipar;
  };
  // Where the block search finds no plan and the late swaps below can follow, BiPar may have
  // to prove there is none first, which is the costliest case: it stops after
  // kFirstEvaluations (t5-large, async, 8 stages, 312 samples: 37,200 evaluations, 7.7 s, none
  // found) and the late swaps are tried. No size in the paper's tables fell so
  // (docs/benchmarks.md, "Ops that keep less than autograd's composition").
  constexpr int64_t kFirstEvaluations = 5000;
  block_then_bipar(/*any=*/false, -1, evaluator.can_late_swap() ? kFirstEvaluations : -1);
  // Where nothing fits, a stage may also swap everything late and stall for the copies
  // (StageEvaluator::allow_late_swap). Not before: ranges that fit only so are slow, but
  // their compute does not say so, so nothing prunes them, and the sweeps would search them
  // all. Here the first plan found will do (any: BiPar stops at it; the block search's still
  // bounds it). Where the block search found none, BiPar gives up after half of the first
  // search's evaluations (at least kLateEvaluations): where nothing fits, proving it takes the
  // longest. Where it found one, BiPar only looks for a faster plan among ones that stall
  // anyway, for kLateEvaluations (t5-large, async, 8 stages, 312 samples: 18,400 evaluations
  // and 4.5 s found none).
  if ((bounds.empty() || !std::isfinite(evaluator.objective(bounds))) && evaluator.allow_late_swap()) {
    constexpr int64_t kLateEvaluations = 1000;
    block_then_bipar(/*any=*/true, kLateEvaluations, std::max(kLateEvaluations, evaluator.evaluations() / 2));
  }
  // Without memory optimization (or memory to save) a stage's time is its compute: the exact DP over the memory
  // formula, bounded by the best found so far, is cheap, and it catches the splits BiPar's
  // sweeps miss (encoder-decoder graphs). Its answer must still fit when checked like the rest.
  if (evaluator.mode() == MemoptKind::None || options.capacity_bytes == kUnlimitedBytes) {  // nothing to evict
    StageEvaluator formula(model, MemoptKind::None, options.capacity_bytes);
    formula.set_stop(planning_stop);
    const Bounds exact = exact_partition(
        formula, bounds.empty() ? std::numeric_limits<double>::infinity() : evaluator.objective(bounds));
    if (!exact.empty() && (bounds.empty() || evaluator.objective(exact) < evaluator.objective(bounds))) bounds = exact;
    // The bottleneck alone leaves the other stages free to be uneven (one large node, e.g. an
    // LM head, sets it): keep it, and balance the rest.
    if (!bounds.empty()) {
      const double bottleneck = evaluator.objective(bounds);
      const Bounds even = balanced_partition(model, options.capacity_bytes, bottleneck * (1 + 1e-12));
      if (!even.empty() && evaluator.objective(even) <= bottleneck) bounds = even;
    }
  }
  return bounds;
}

// The plan of these cuts, each stage as the evaluator judged it.
Plan plan_of(const Profile& profile, const PlanOptions& options, StageEvaluator& evaluator, const Bounds& bounds) {
  Plan plan;
  plan.model = profile.model;
  plan.preset = profile.preset;
  plan.precision = profile.precision;
  plan.graph_hash = profile.graph_hash;
  plan.options = options;
  plan.options.host_link = evaluator.model().host_link();  // what the swaps were timed with
  plan.micro_batch_size = profile.micro_batch_size;
  plan.nodes = profile.size();
  for (int x = 0; x < options.stages; ++x)
    plan.stages.push_back(evaluator.stage_plan(bounds[static_cast<size_t>(x)], bounds[static_cast<size_t>(x) + 1], x));
  const CostModel& model = evaluator.model();
  if (model.ranks() < options.stages)  // several stages per rank: what each rank holds at once
    for (int r = 0; r < model.ranks(); ++r) {
      std::vector<StageProgram> programs;
      for (const StagePlan& s : plan.stages)
        if (s.index % model.ranks() == r)
          programs.push_back(stage_program(model, s.begin, s.end, s.index, s.decisions));
      plan.rank_replayed_peaks.push_back(replay_rank_peak(model, programs, model.rank_actions(r)));
    }
  plan.time_step();
  return plan;
}

// replay_capacity > 0: a stage fits when its replayed peak fits this (StageEvaluator).
std::optional<Plan> search(const Profile& profile, const PlanOptions& options, int64_t replay_capacity) {
  CostModel model(profile, options);
  // A node whose forward alone needs more than a stage holds fits no stage (its tensors are a
  // lower bound of any replayed peak): refused before any search, which would have to try every
  // partition to find that out (the --max-batch search's sizes above its answer).
  if (model.forward_need_bytes(0, model.size()) > options.capacity_bytes) return std::nullopt;
  // The block planners of systems that checkpoint or swap whole layers: coarse memory
  // optimization (a block's internal tensors together; block outputs stay as checkpoints).
  const bool blocks = options.planner == PlannerKind::VPipe || options.planner == PlannerKind::GPipe;
  StageEvaluator evaluator(model, options.memopt, options.capacity_bytes,
                           blocks ? MemoptGranularity::Block : MemoptGranularity::Tensor);
  evaluator.set_stop(planning_stop);
  evaluator.set_replay_capacity(replay_capacity);
  Bounds bounds;
  if (options.planner == PlannerKind::DawnPiper)
    bounds = dawnpiper_bounds(model, evaluator, options);
  else if (options.planner == PlannerKind::Exact)
    bounds = exact_partition(evaluator);
  else if (options.planner == PlannerKind::GPipe)
    bounds = gpipe_partition(model);
  else if (options.planner == PlannerKind::PipeDream)
    bounds = pipedream_partition(model);
  else if (options.planner == PlannerKind::VPipe)
    bounds = vpipe_partition(evaluator);
  else if (options.planner == PlannerKind::Even)
    bounds = even_partition(model);
  if (bounds.empty() || !std::isfinite(evaluator.objective(bounds)) || planning_stopped()) return std::nullopt;
  return plan_of(profile, options, evaluator, bounds);
}

}  // namespace

std::optional<Plan> try_plan(const Profile& profile, const PlanOptions& options) {
  validate(profile, options);
  const Stopwatch planning;
  const bool limited = options.capacity_bytes != kUnlimitedBytes;
  // The search fits each stage; a rank's V stages each get capacity / V (plan_options.h).
  const int v = options.schedule.virtual_stages();
  const int64_t replay_capacity = options.fit_replayed && limited ? options.capacity_bytes / v : 0;
  auto search_within = [&](int64_t rank_capacity) {
    PlanOptions per_stage = options;
    if (limited) per_stage.capacity_bytes = rank_capacity / v;
    return search(profile, per_stage, replay_capacity);
  };
  std::optional<Plan> plan = search_within(options.capacity_bytes);
  auto overshoot = [&](const Plan& p) {
    int64_t most = INT64_MIN;
    for (int64_t peak : p.rank_peak_bytes(true)) most = std::max(most, peak - options.capacity_bytes);
    return most;
  };
  if (plan && options.fit_replayed && limited && overshoot(*plan) > 0) {
    // The largest search capacity whose plan fits when replayed: a capacity too small has no
    // plan, one too large overshoots. First guess: lowered by the overshoot; then bisection.
    std::optional<Plan> best;
    int64_t lo = 0, hi = options.capacity_bytes;
    int64_t next = options.capacity_bytes - overshoot(*plan);
    for (int round = 0; round < 12 && hi - lo > hi / 256; ++round) {
      if (planning_stopped()) return std::nullopt;
      const int64_t c = next > lo && next < hi ? next : lo + (hi - lo) / 2;
      next = -1;
      std::optional<Plan> candidate = search_within(c);
      if (!candidate) {
        lo = c;
      } else if (overshoot(*candidate) > 0) {
        hi = c;
      } else {
        lo = c;
        best = std::move(candidate);
      }
    }
    plan = std::move(best);
  }
  if (!plan) return std::nullopt;
  const HostLink link = plan->options.host_link;  // what the search timed swaps with
  plan->options = options;
  plan->options.host_link = link;
  plan->planning_ms = planning.ms();
  return plan;
}

std::string split_backward_refusal(const Profile& profile, const Plan& plan) {
  const auto& nodes = profile.nodes;
  for (const StagePlan& s : plan.stages)
    for (int n = s.begin; n < s.end; ++n) {
      const int owner = nodes[static_cast<size_t>(n)].tied_owner;
      if (owner < 0 || owner == n) continue;
      // The weight's reader before n on this stage: its owner, or another user of it (T5's
      // decoder embedding before the head, both using the encoder's).
      int earlier = owner >= s.begin && owner < s.end ? owner : -1;
      for (int k = s.begin; k < n && earlier < 0; ++k)
        if (nodes[static_cast<size_t>(k)].tied_owner == owner) earlier = k;
      if (earlier < 0) continue;
      const int first = std::min(earlier, n), second = std::max(earlier, n);
      if (feeds(profile, first, second))
        return "stage " + std::to_string(s.index) + " cannot split its backward (" + name_of(plan.options.schedule) +
               "): " + nodes[static_cast<size_t>(first)].name + " and " + nodes[static_cast<size_t>(second)].name +
               " read one weight and the first feeds the second (its weight gradient would count the first's "
               "twice); cut between them or use a schedule without I and W (1f1b, gpipe)";
    }
  return "";
}

Plan make_plan(const Profile& profile, const PlanOptions& options) {
  std::optional<Plan> plan = try_plan(profile, options);
  if (plan && options.schedule.traits().splits_backward) {
    const std::string why = split_backward_refusal(profile, *plan);
    if (!why.empty()) throw ConfigError(why);
  }
  if (plan) return std::move(*plan);
  std::string message = describe(profile, options) + node_needs_text(profile, options) + needs_text(profile, options);
  if (has_batch_fits(profile)) {
    std::optional<MaxBatch> fit;
    if (profile.micro_batch_size > 1) fit = max_batch(profile, options, profile.micro_batch_size - 1, usable_cores());
    if (fit)
      message += "; the largest micro-batch size that fits " +
                 format_bytes(static_cast<double>(options.capacity_bytes)) + " is " +
                 std::to_string(fit->micro_batch_size);
    else
      message += "; not even micro-batch size 1 fits " + format_bytes(static_cast<double>(options.capacity_bytes));
  }
  throw InfeasibleError(message);
}

MaxBatch find_max_batch(const Profile& profile, const PlanOptions& options, int64_t upper_bound, int threads) {
  return find_max_batch(
      profile, options, [&](const Profile& at) { return try_plan(at, options); }, upper_bound, threads);
}

MaxBatch find_max_batch(const Profile& profile, const PlanOptions& options, const PlanAtBatch& plan_at,
                        int64_t upper_bound, int threads) {
  if (upper_bound < 1) throw ConfigError("the micro-batch size bound must be at least 1");
  validate(profile, options);
  if (!has_batch_fits(profile))
    throw ConfigError("the profile has no batch-size fits; profile it at two or more batch " +
                      std::string("sizes to search the micro-batch size"));
  if (threads < 0) throw ConfigError("the number of planning threads must not be negative");
  std::optional<MaxBatch> fit =
      BatchProbes(profile, plan_at, upper_bound, threads == 0 ? usable_cores() : threads).run();
  if (fit) return std::move(*fit);
  Profile one = profile.at_batch(1);
  throw InfeasibleError(describe(one, options) + node_needs_text(one, options) + needs_text(one, options) +
                        "; not even micro-batch size 1 fits");
}

}  // namespace dawnpiper
