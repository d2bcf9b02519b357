#pragma once
// Pipeline schedules as per-stage action lists (DeepSpeed / torch.distributed.pipelining style):
// a generator decides the order, the runtime only executes it, the planner simulates it.
//
// Stages are 0-based (x = 0 .. l-1), micro-batches 0 .. m-1. Every forward on a stage x > 0 is
// preceded by RECV_F and every forward on x < l-1 followed by SEND_F; symmetrically for
// backward with RECV_B / SEND_B. A receive waits for its matching send; a send does not wait for
// its receive, only for the stage's previous send to be received (schedule/simulate.h).
//
// A schedule is data: a generator of compute actions in its own file and one line of the
// registry (schedule/registry.cpp) naming it with its traits. A user's own schedule is a file of
// actions (ScheduleChoice::named("file:PATH")). The registered ones:
//
//  gpipe  all m forwards, then all m backwards in the same order (0..m-1), then one optimizer
//         step. Every micro-batch is in flight at once: in-flight count m on every stage.
//  1f1b   synchronous 1F1B (DAPPLE / Megatron non-interleaved): stage x warms up with
//         w = min(l-x-1, m) forwards, then alternates one forward and one backward, drains the
//         last w backwards, then one optimizer step (a flush per mini-batch). In flight:
//         min(l-x, m) micro-batches.
//  async  PipeDream 1F1B without flush: the same warm-up and alternation, but an optimizer step
//         after every backward and weight stashing (a forward uses the current weights, its
//         backward the version that forward used). Stage x holds l-x micro-batches and l-x
//         weight versions in the steady state. The list covers a stream of `micro_batches`
//         micro-batches (the runtime passes steps * micro-batches per step); the drain at its
//         end happens once per run, not per mini-batch.
//  zb-h1  ZB-H1 (zero bubble): every backward split into I (input gradients, sent back at once)
//         and W (weight gradients, later), W filling the bubbles (schedule/zero_bubble.cpp). With
//         uniform stages (l-1)(F+I-W) of idle time instead of 1F1B's (l-1)(F+I+W); in flight
//         (forwarded, W not run): min(l, m) on every stage.
//  zb-h2  ZB-H2: the same split, stages forwarding up to 2l-1 micro-batches ahead so that the
//         warm-up idles too little to matter: m(F+I+W) + (l-1)F once m >= 2l
//         (schedule/zb_h2.cpp); two sends going per rank.
//  interleaved  Megatron's interleaved 1F1B: each of the l ranks runs V stages (model chunks),
//         stage s on rank s mod l (schedule/interleaved.cpp). Uniform stages idle (l-1)(F+B)/V
//         per rank instead of (l-1)(F+B), for more micro-batches in flight.
//
// A list belongs to a rank; each action names its stage. Every schedule but interleaved puts
// one stage on each rank (V = 1), where rank and stage are the same number.
#include <algorithm>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "schedule/action.h"
#include "util/enum_names.h"

namespace dawnpiper {
// What the runtime, the planner's memory replay and its cost model need to know of a schedule
// besides its action lists. Code outside lib/schedule asks these, never which schedule runs.
struct ScheduleTraits {
  // One optimizer step per training step on the summed gradients of all its micro-batches (each
  // loss scaled 1/m), reduced before it: tied weights across stages, data-parallel replicas, the
  // global norm that clipping needs. false: an update after every backward on that backward's
  // gradients alone (PipeDream).
  bool updates_once_per_step = true;
  // Nothing is in flight between steps, so one step's list repeats. false: one list for the run's
  // stream of micro-batches, drained only where the run asks (checkpoints, evaluation).
  bool drains_every_step = true;
  // A forward's weights are kept for its backward while updates happen in between (weight
  // stashing): a stage holds one weight version per micro-batch in flight.
  bool stashes_weights = false;
  // Backwards split into I and W (zero-bubble schedules): exact only on stages where no
  // parameter's reader feeds another of its readers (exec/split_backward.h).
  bool splits_backward = false;
  // Several stages per rank (--virtual-stages V), placed round robin: stage s on rank s mod l.
  // 0: one stage per rank.
  int default_virtual_stages = 0;
  bool interleaves() const { return default_virtual_stages > 0; }
  // Sends a rank keeps going at once (Schedule::sends_in_flight): interleaved's ranks send both
  // ways on one link, and with one send at a time two ranks would each wait for the other.
  int sends_in_flight = 1;

  // The factor of one micro-batch's loss in the gradients an update uses.
  double loss_scale(int64_t micro_batches) const {
    return updates_once_per_step ? 1.0 / static_cast<double>(micro_batches) : 1.0;
  }
  // Micro-batches to simulate for the steady state: one step, or for a stream at least enough to
  // fill and drain the pipeline twice.
  int64_t simulated_micro_batches(int stages, int64_t micro_batches) const {
    return drains_every_step ? micro_batches : std::max<int64_t>(micro_batches, 2 * stages);
  }
};

struct Schedule {
  std::string name;  // the registered schedule's, or "file:PATH"
  int stages = 0;    // ranks x virtual stages
  int64_t micro_batches = 0;
  // actions[r]: rank r's list, in execution order; its actions are those of the stages s with
  // s mod ranks() == r.
  std::vector<std::vector<Action>> actions;
  // Sends a rank's transport keeps going before it completes the oldest: a send waits while
  // this many of its rank's are not yet received.
  int sends_in_flight = 1;

  int ranks() const { return static_cast<int>(actions.size()); }
  int rank_of(int stage) const { return stage % ranks(); }
  // Stage s's actions, in its rank's order.
  std::vector<Action> stage_actions(int stage) const;
  // One line per rank, compact action forms ("0F0 0SEND_F0 0F1 ...").
  std::string to_string() const;
};

// Adds the communication that compute lists imply (as PyTorch's _add_send_recv): a receive
// before every forward on a stage with one before it and every backward on a stage with one
// after it, a send after each. Sends never block, so right after the compute is always safe; a
// receive right before its compute is as late as it can be. Every generator ends with it.
void add_communication(Schedule& schedule);

// A schedule to run: a registered one, or a user's file of actions in the text form (one line
// per stage, '#' comments; compute actions only, or with every send and receive written out),
// read once. What a plan holds and the runtime follows; a ScheduleRequest may still be `auto`.
class ScheduleChoice {
 public:
  ScheduleChoice() = default;  // 1f1b
  // A registered name or "file:PATH". An unknown name is a ConfigError listing the registered
  // ones ("auto" among them: the request's, plan/plan_request.h); a file whose actions cannot
  // run one naming the stage and the action.
  static ScheduleChoice named(const std::string& name);
  // A file's actions as read once (plans carry them, so what `plan` read is what `train` runs).
  static ScheduleChoice from_actions(const std::string& name, const std::string& text);

  const std::string& name() const { return name_; }
  bool is_file() const { return file_ != nullptr; }
  const std::string& actions_text() const { return text_; }      // a file's, empty otherwise
  int file_stages() const { return file_ ? file_->stages : 0; }  // 0: any
  const ScheduleTraits& traits() const;
  // Stages per rank: --virtual-stages, or the schedule's default (1 where it does not
  // interleave). with_virtual_stages(0) takes the default; V > 1 on a schedule that does not
  // interleave is a ConfigError.
  int virtual_stages() const { return virtual_stages_; }
  ScheduleChoice with_virtual_stages(int v) const;
  // The action lists of `stages` stages (ranks x virtual stages) over `micro_batches`
  // micro-batches, communication added. ConfigError for sizes below 1, stages the virtual
  // stages do not divide, or a file written for other sizes.
  Schedule make(int stages, int64_t micro_batches) const;

  bool operator==(const ScheduleChoice& o) const {
    return name_ == o.name_ && text_ == o.text_ && virtual_stages_ == o.virtual_stages_;
  }
  bool operator!=(const ScheduleChoice& o) const { return !(*this == o); }

 private:
  std::string name_ = "1f1b";
  std::shared_ptr<const Schedule> file_;  // checked: runs without deadlock on its own sizes
  std::string text_;
  ScheduleTraits file_traits_;  // a file's: synchronous, splitting where it holds an I
  int virtual_stages_ = 1;
};
// The choice goes by name in plan files and messages, like the enums (util/enum_names.h).
inline const char* name_of(const ScheduleChoice& choice) { return choice.name().c_str(); }
template <>
struct has_enum_names<ScheduleChoice> : std::true_type {};
template <>
ScheduleChoice from_name<ScheduleChoice>(const std::string& name);

// What --schedule asks for: one ScheduleChoice, or `auto`: the planner plans each candidate and
// keeps the fastest predicted step that fits (plan/schedule_search.h). Only the planner resolves
// a request; everything after it reads the plan's ScheduleChoice.
class ScheduleRequest {
 public:
  ScheduleRequest() = default;                                            // 1f1b
  ScheduleRequest(ScheduleChoice choice) : choice_(std::move(choice)) {}  // NOLINT: a choice is a request for it
  // "auto", or what ScheduleChoice::named takes.
  static ScheduleRequest named(const std::string& name);

  bool is_auto() const { return automatic_; }
  std::string name() const { return automatic_ ? "auto" : choice_.name(); }
  // The one schedule asked for; a logic error under auto (ask is_auto, or candidates()).
  const ScheduleChoice& choice() const;
  // --virtual-stages V (0: each schedule's default), applied to the choice or, under auto, to the
  // candidates that interleave; V > 1 for a schedule that does not interleave is a ConfigError.
  ScheduleRequest with_virtual_stages(int v) const;
  // Stages per rank of the choice; under auto, V as given (1 where not given).
  int virtual_stages() const;
  // What the request may resolve to: the choice, or under auto every registered schedule that
  // updates once per step (PipeDream's async trains another model: stale weights), each with its
  // virtual stages.
  std::vector<ScheduleChoice> candidates() const;
  // Whether a plan made with `planned` is what this asks for (auto: any).
  bool admits(const ScheduleChoice& planned) const;

 private:
  bool automatic_ = false;
  int given_virtual_stages_ = 0;  // under auto
  ScheduleChoice choice_;
};
// A request goes by name on the command line, like the enums (util/enum_names.h).
inline std::string name_of(const ScheduleRequest& request) { return request.name(); }
template <>
struct has_enum_names<ScheduleRequest> : std::true_type {};
template <>
ScheduleRequest from_name<ScheduleRequest>(const std::string& name);

// Registered names joined as in errors ("gpipe, 1f1b or async").
std::string schedule_choices();
// What --schedule takes, for --help: every registered name with its summary, auto and file:PATH.
std::string schedule_help();
// ScheduleChoice::named(name).make(stages, micro_batches).
Schedule make_schedule(const std::string& name, int stages, int64_t micro_batches);
// A rank's list as it runs: `actions` (the schedule's, for that rank or one of its stages) with a
// ReduceTiedGrads of each stage in `holding_tied` (stages holding weights tied to another
// stage's) before its rank's updates of a step, when the schedule updates once per step
// (PipeDream's updates have no rule for tied weights: each copy is updated with its own stage's
// gradients). The planner's stage programs and the runtime's lists both come from here.
std::vector<Action> add_tied_reductions(const ScheduleTraits& traits, std::vector<Action> actions,
                                        const std::set<int>& holding_tied);
// Whether stage nodes [begin, end) share a tied weight with a node outside (GPT-2's embedding
// and LM head), from `tied_owner` (per node, the node owning the tied parameters it reads, -1
// where none: OpGraph::tied_owners, as the profile records it): the one test of which stages
// add_tied_reductions gives a ReduceTiedGrads, for the planner's stage programs and the runtime's lists.
bool holds_tied_across(const std::vector<int>& tied_owner, int begin, int end);

}  // namespace dawnpiper
