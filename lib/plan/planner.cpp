#include "plan/planner.h"

#include <algorithm>
#include <sched.h>

#include <chrono>
#include <cmath>
#include <future>
#include <limits>
#include <map>
#include <thread>

#include "plan/baselines.h"
#include "plan/bipar.h"
#include "plan/cost_model.h"
#include "plan/stage_evaluator.h"
#include "util/error.h"
#include "util/units.h"

namespace dawnpiper {

namespace {

void validate(const Profile& profile, const PlanOptions& options) {
  if (options.stages < 1) throw ConfigError("the number of stages must be at least 1");
  if (options.stages > profile.size())
    throw ConfigError("cannot split " + std::to_string(profile.size()) + " nodes into " +
                      std::to_string(options.stages) + " stages");
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
  if (bytes == INT64_MAX) return "unlimited memory";
  return format_bytes(static_cast<double>(bytes)) + " (" + std::to_string(bytes) + " bytes)";
}

// The smallest capacity with which the planner finds a plan at this micro-batch size, to a
// relative precision of 1/2000 (every answer is verified by planning).
int64_t needed_capacity(const Profile& profile, const PlanOptions& options) {
  PlanOptions o = options;
  o.capacity_bytes = INT64_MAX;
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

// Plans at micro-batch sizes, remembered by size. `speculate` plans several sizes at once, one
// thread each (plans are independent: each builds its own cost model and evaluator), so the
// search below can ask for the sizes it may need next while it still needs only one; it then
// decides exactly as with one thread, and finds the same answer.
class BatchProbes {
 public:
  BatchProbes(const Profile& profile, const PlanOptions& options, int threads)
      : profile_(profile), options_(options), threads_(std::max(1, threads)) {}
  int threads() const { return threads_; }

  void speculate(std::vector<int64_t> sizes) {
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    sizes.erase(std::remove_if(sizes.begin(), sizes.end(), [&](int64_t b) { return known_.count(b) > 0; }),
                sizes.end());
    if (sizes.size() > static_cast<size_t>(threads_)) sizes.resize(static_cast<size_t>(threads_));
    if (sizes.size() < 2) return;  // at() plans a single size on this thread
    std::vector<std::future<std::optional<Plan>>> running;
    for (int64_t b : sizes)
      running.push_back(std::async(std::launch::async, [this, b] { return try_plan(profile_.at_batch(b), options_); }));
    for (size_t i = 0; i < sizes.size(); ++i) known_.emplace(sizes[i], running[i].get());
  }

  bool fits(int64_t b) { return at(b).has_value(); }

  const std::optional<Plan>& at(int64_t b) {
    auto found = known_.find(b);
    if (found == known_.end()) found = known_.emplace(b, try_plan(profile_.at_batch(b), options_)).first;
    return found->second;
  }

 private:
  const Profile& profile_;
  const PlanOptions& options_;
  const int threads_;
  std::map<int64_t, std::optional<Plan>> known_;
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

// The bisection's next midpoints, breadth first: the one it needs now and those it will need
// after either answer, as many as there are threads.
std::vector<int64_t> bisection_ahead(int64_t lo, int64_t hi, int count) {
  std::vector<int64_t> out;
  std::vector<std::pair<int64_t, int64_t>> level{{lo, hi}};
  while (!level.empty() && static_cast<int>(out.size()) < count) {
    std::vector<std::pair<int64_t, int64_t>> next;
    for (auto [l, h] : level) {
      if (h - l <= 1) continue;
      const int64_t mid = l + (h - l) / 2;
      out.push_back(mid);
      next.push_back({mid, h});
      next.push_back({l, mid});
    }
    level = std::move(next);
  }
  if (static_cast<int>(out.size()) > count) out.resize(static_cast<size_t>(count));
  return out;
}

std::optional<MaxBatch> max_batch(const Profile& profile, const PlanOptions& options, int64_t upper_bound,
                                  int threads) {
  BatchProbes probes(profile, options, threads);
  const int w = probes.threads();
  if (!probes.fits(1)) return std::nullopt;
  int64_t lo = 1, hi = -1;            // lo fits; hi (when known) does not
  int64_t ceiling = upper_bound + 1;  // the first doubling that did not fit
  for (int64_t b = 2; hi < 0; b *= 2) {
    std::vector<int64_t> ahead;
    for (int64_t c = b; static_cast<int>(ahead.size()) < w; c *= 2) {
      ahead.push_back(std::min(c, upper_bound));
      if (c >= upper_bound) break;
    }
    probes.speculate(ahead);
    int64_t probe = std::min(b, upper_bound);
    if (probe <= lo) break;  // lo == upper_bound
    if (probes.fits(probe)) {
      lo = probe;
      if (probe == upper_bound) break;
    } else {
      hi = ceiling = probe;
    }
  }
  // Past the bisection, the sizes up to lo + kMisses are probed (below): a thread the
  // bisection leaves idle plans the first of them above hi.
  constexpr int64_t kMisses = 4;
  while (hi > 0 && hi - lo > 1) {
    std::vector<int64_t> ahead = bisection_ahead(lo, hi, w);
    for (int64_t b = hi + 1; static_cast<int>(ahead.size()) < w && b <= lo + kMisses && b < ceiling; ++b)
      ahead.push_back(b);
    probes.speculate(ahead);
    int64_t mid = lo + (hi - lo) / 2;
    if (probes.fits(mid))
      lo = mid;
    else
      hi = mid;
  }
  // The search is a heuristic and need not be monotone in the micro-batch size (the candidate
  // cuts move with it: gpt2-tiny, async, r, 3 MiB: 5 fits, 6 does not, 7 does). Probe on above
  // the bisection's answer until kMisses sizes in a row do not fit.
  for (int64_t b = lo + 1, misses = 0; b < ceiling && misses < kMisses; ++b) {
    std::vector<int64_t> ahead;
    for (int64_t c = b; c < ceiling && static_cast<int>(ahead.size()) < w; ++c) ahead.push_back(c);
    probes.speculate(ahead);
    if (probes.fits(b)) {
      lo = b, misses = 0;
    } else {
      ++misses;
    }
  }
  return MaxBatch{lo, *probes.at(lo)};
}

std::string describe(const Profile& profile, const PlanOptions& options) {
  std::string model = profile.preset.empty() ? profile.model : profile.preset;
  return std::string("planner '") + planner_kind_name(options.planner) + "' found no plan for " +
         (model.empty() ? std::string("the model") : model) + " on " + std::to_string(options.stages) +
         " stages (schedule " + schedule_kind_name(options.schedule) + ", " + std::to_string(options.micro_batches) +
         " micro-batches of " + std::to_string(profile.micro_batch_size) + ", optimizer " +
         optimizer_kind_name(options.optimizer) + ", memopt " + memopt_mode_name(options.memopt) + ") within " +
         capacity_text(options.capacity_bytes) + " per stage";
}

std::string needs_text(const Profile& profile, const PlanOptions& options) {
  return "; it needs at least " + capacity_text(needed_capacity(profile, options)) + " per stage at micro-batch size " +
         std::to_string(profile.micro_batch_size);
}

}  // namespace

namespace {

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
  Bounds bounds;
  evaluator.set_replay_capacity(replay_capacity);
  if (options.planner == PlannerKind::DawnPiper) {
    // Two candidates. Cuts at block boundaries refined by Kernighan-Lin moves (vPipe's search),
    // judged by the same tensor-level evaluator: BiPar's sweeps assume feasibility is monotone
    // in a stage's range, which the replayed peak is not (more recomputation holds more re-run
    // buffers), so they can miss splits this local search finds. It is cheap, so it goes
    // first, and BiPar searches only for something faster (its sweeps prune by that time).
    // BiPar may make `if_found` / `if_none` evaluations (-1: no limit), as the block search
    // found a plan or not. The limit holds for BiPar only.
    auto block_then_bipar = [&](bool any, int64_t if_found, int64_t if_none) {
      bounds =
          static_cast<int>(block_boundaries(model).size()) > options.stages ? vpipe_partition(evaluator) : Bounds{};
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
    // (docs/benchmarks.md, fourteenth session).
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
    if (evaluator.mode() == MemoptMode::None || options.capacity_bytes == INT64_MAX) {  // nothing to evict
      StageEvaluator formula(model, MemoptMode::None, options.capacity_bytes);
      const Bounds exact = exact_partition(
          formula, bounds.empty() ? std::numeric_limits<double>::infinity() : evaluator.objective(bounds));
      if (!exact.empty() && (bounds.empty() || evaluator.objective(exact) < evaluator.objective(bounds)))
        bounds = exact;
      // The bottleneck alone leaves the other stages free to be uneven (one large node, e.g. an
      // LM head, sets it): keep it, and balance the rest.
      if (!bounds.empty()) {
        const double bottleneck = evaluator.objective(bounds);
        const Bounds even = balanced_partition(model, options.capacity_bytes, bottleneck * (1 + 1e-12));
        if (!even.empty() && evaluator.objective(even) <= bottleneck) bounds = even;
      }
    }
  } else if (options.planner == PlannerKind::Exact)
    bounds = exact_partition(evaluator);
  else if (options.planner == PlannerKind::GPipe)
    bounds = gpipe_partition(model);
  else if (options.planner == PlannerKind::PipeDream)
    bounds = pipedream_partition(model);
  else if (options.planner == PlannerKind::VPipe)
    bounds = vpipe_partition(evaluator);
  else if (options.planner == PlannerKind::Even)
    bounds = even_partition(model);
  if (bounds.empty() || !std::isfinite(evaluator.objective(bounds))) return std::nullopt;

  Plan plan;
  plan.model = profile.model;
  plan.preset = profile.preset;
  plan.precision = profile.precision;
  plan.graph_hash = profile.graph_hash;
  plan.options = options;
  plan.micro_batch_size = profile.micro_batch_size;
  plan.nodes = profile.size();
  for (int x = 0; x < options.stages; ++x)
    plan.stages.push_back(evaluator.stage_plan(bounds[static_cast<size_t>(x)], bounds[static_cast<size_t>(x) + 1], x));
  return plan;
}

}  // namespace

std::optional<Plan> try_plan(const Profile& profile, const PlanOptions& options) {
  validate(profile, options);
  const auto start = std::chrono::steady_clock::now();
  const int64_t replay_capacity =
      options.fit_replayed && options.capacity_bytes != INT64_MAX ? options.capacity_bytes : 0;
  std::optional<Plan> plan = search(profile, options, replay_capacity);
  auto overshoot = [&](const Plan& p) {
    int64_t most = INT64_MIN;
    for (const StagePlan& s : p.stages) most = std::max(most, s.memory.predicted_peak() - options.capacity_bytes);
    return most;
  };
  if (plan && options.fit_replayed && options.capacity_bytes != INT64_MAX && overshoot(*plan) > 0) {
    // The largest search capacity whose plan fits when replayed: a capacity too small has no
    // plan, one too large overshoots. First guess: lowered by the overshoot; then bisection.
    std::optional<Plan> best;
    int64_t lo = 0, hi = options.capacity_bytes;
    int64_t next = options.capacity_bytes - overshoot(*plan);
    for (int round = 0; round < 12 && hi - lo > hi / 256; ++round) {
      const int64_t c = next > lo && next < hi ? next : lo + (hi - lo) / 2;
      next = -1;
      PlanOptions tightened = options;
      tightened.capacity_bytes = c;
      std::optional<Plan> candidate = search(profile, tightened, replay_capacity);
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
  plan->options = options;
  plan->planning_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return plan;
}

Plan make_plan(const Profile& profile, const PlanOptions& options) {
  std::optional<Plan> plan = try_plan(profile, options);
  if (plan) return std::move(*plan);
  std::string message = describe(profile, options) + needs_text(profile, options);
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
  if (upper_bound < 1) throw ConfigError("the micro-batch size bound must be at least 1");
  validate(profile, options);
  if (!has_batch_fits(profile))
    throw ConfigError("the profile has no batch-size fits; profile it at two or more batch " +
                      std::string("sizes to search the micro-batch size"));
  if (threads < 0) throw ConfigError("the number of planning threads must not be negative");
  std::optional<MaxBatch> fit = max_batch(profile, options, upper_bound, threads == 0 ? usable_cores() : threads);
  if (fit) return std::move(*fit);
  Profile one = profile.at_batch(1);
  throw InfeasibleError(describe(one, options) + needs_text(one, options) + "; not even micro-batch size 1 fits");
}

}  // namespace dawnpiper
