#include "schedule/registry.h"

#include <set>
#include <sstream>
#include <stdexcept>

#include "schedule/simulate.h"
#include "util/error.h"
#include "util/files.h"

namespace dawnpiper {

// Each generator, in its own file.
ComputeLists gpipe_actions(const ScheduleShape& shape);
ComputeLists one_f_one_b_actions(const ScheduleShape& shape);
ComputeLists async_actions(const ScheduleShape& shape);
ComputeLists zb_h1_actions(const ScheduleShape& shape);
ComputeLists zb_h2_actions(const ScheduleShape& shape);
ComputeLists interleaved_actions(const ScheduleShape& shape);

namespace {
const ScheduleTraits kSynchronous{};
const ScheduleTraits kPipeDream{/*updates_once_per_step=*/false, /*drains_every_step=*/false,
                                /*stashes_weights=*/true};
const ScheduleTraits kZeroBubble{/*updates_once_per_step=*/true, /*drains_every_step=*/true,
                                 /*stashes_weights=*/false, /*splits_backward=*/true};
const ScheduleTraits kZeroBubbleAhead{
    /*updates_once_per_step=*/true, /*drains_every_step=*/true,
    /*stashes_weights=*/false,      /*splits_backward=*/true,
    /*default_virtual_stages=*/0,   /*sends_in_flight=*/2};
const ScheduleTraits kInterleaved{/*updates_once_per_step=*/true, /*drains_every_step=*/true,
                                  /*stashes_weights=*/false,      /*splits_backward=*/false,
                                  /*default_virtual_stages=*/2,   /*sends_in_flight=*/2};
}  // namespace

const std::vector<ScheduleEntry>& registered_schedules() {
  static const std::vector<ScheduleEntry> entries{
      {"gpipe", "all forwards, then all backwards, one update", kSynchronous, gpipe_actions},
      {"1f1b", "one forward, one backward after a warm-up, one update", kSynchronous, one_f_one_b_actions},
      {"async", "PipeDream: 1F1B, an update after every backward, weight stashing", kPipeDream, async_actions},
      {"zb-h1", "zero bubble (ZB-H1): backward split into I and W, W fills the bubbles; holds min(l, m)", kZeroBubble,
       zb_h1_actions},
      {"zb-h2", "zero bubble (ZB-H2): as zb-h1, forwarding up to 2l-1 micro-batches ahead to fill the warm-up too",
       kZeroBubbleAhead, zb_h2_actions},
      {"interleaved", "Megatron's interleaved 1F1B: V stages per rank (--virtual-stages), a bubble V times smaller",
       kInterleaved, interleaved_actions},
  };
  return entries;
}

namespace {

const ScheduleEntry* find_registered(const std::string& name) {
  for (const ScheduleEntry& e : registered_schedules())
    if (name == e.name) return &e;
  return nullptr;
}

void check_sizes(int stages, int64_t micro_batches) {
  if (stages < 1) throw ConfigError("a schedule needs at least one stage");
  if (micro_batches < 1) throw ConfigError("a schedule needs at least one micro-batch");
}

bool is_compute(ActionKind kind) {
  return kind == ActionKind::Forward || kind == ActionKind::Backward || kind == ActionKind::BackwardInput ||
         kind == ActionKind::BackwardWeight || kind == ActionKind::OptimizerStep;
}
bool is_communication(ActionKind kind) {
  return kind == ActionKind::SendActivation || kind == ActionKind::RecvActivation || kind == ActionKind::SendGrad ||
         kind == ActionKind::RecvGrad;
}

// One line per stage; '#' starts a comment. Checks what the simulators cannot word for a file.
Schedule parse_schedule_file(const std::string& name, const std::string& text) {
  const std::string where = "schedule " + name;
  Schedule s{name, 0, 0, {}};
  std::istringstream in(text);
  std::string line;
  bool written_communication = false;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    line = line.substr(0, line.find('#'));
    std::vector<Action> list;
    try {
      list = parse_actions(line);
    } catch (const ConfigError& e) {
      throw ConfigError(where + ", line " + std::to_string(line_no) + ": " + e.reason());
    }
    if (list.empty()) continue;
    const int x = static_cast<int>(s.actions.size());
    for (const Action& a : list) {
      const std::string at = where + ", stage " + std::to_string(x) + " (line " + std::to_string(line_no) +
                             "), action " + to_string(a) + ": ";
      if (a.stage != x) throw ConfigError(at + "the line of stage " + std::to_string(x) + " holds its actions only");
      if (!is_compute(a.kind) && !is_communication(a.kind))
        throw ConfigError(at +
                          "the runtime adds its own evictions and reductions; a schedule holds F, B, I, W, U, "
                          "SEND and RECV actions");
      written_communication = written_communication || is_communication(a.kind);
    }
    // One update per step, after everything: the file's schedule is synchronous.
    int updates = 0;
    for (const Action& a : list) updates += a.kind == ActionKind::OptimizerStep;
    if (updates != 1 || list.back().kind != ActionKind::OptimizerStep)
      throw ConfigError(where + ", stage " + std::to_string(x) + " (line " + std::to_string(line_no) +
                        "): a schedule file updates once per step, as each stage's last action (" + std::to_string(x) +
                        "U)");
    s.actions.push_back(std::move(list));
  }
  if (s.actions.empty()) throw ConfigError(where + " holds no actions");
  s.stages = static_cast<int>(s.actions.size());
  std::set<int64_t> forwarded;
  for (const Action& a : s.actions.front())
    if (a.kind == ActionKind::Forward) forwarded.insert(a.micro_batch);
  s.micro_batches = static_cast<int64_t>(forwarded.size());
  if (forwarded.empty() || *forwarded.rbegin() != s.micro_batches - 1)
    throw ConfigError(where + ": stage 0 forwards micro-batches that are not 0 .. " +
                      std::to_string(s.micro_batches - 1));
  if (!written_communication) add_communication(s);
  try {
    simulate_global(s);  // every stage well-formed, the same micro-batches, no deadlock
  } catch (const ScheduleError& e) {
    throw ConfigError(where + ": " + e.what());
  }
  return s;
}

}  // namespace

ScheduleChoice ScheduleChoice::named(const std::string& name) {
  const std::string file_prefix = "file:";
  if (name.compare(0, file_prefix.size(), file_prefix) == 0) {
    const std::string path = name.substr(file_prefix.size());
    if (path.empty()) throw ConfigError("--schedule file: needs a path (file:PATH)");
    return from_actions(name, read_text_file(path));
  }
  if (name == "auto")
    throw ConfigError("auto is a request the planner resolves, not a schedule to run (choose " + schedule_choices() +
                      " or file:PATH)");
  if (!find_registered(name))
    throw ConfigError("unknown schedule '" + name + "' (choose " + schedule_choices() + ", auto or file:PATH)");
  ScheduleChoice c;
  c.name_ = name;
  return c.with_virtual_stages(0);
}

ScheduleChoice ScheduleChoice::with_virtual_stages(int v) const {
  if (v < 0) throw ConfigError("--virtual-stages must be at least 1");
  ScheduleChoice c = *this;
  const ScheduleTraits& t = traits();
  if (v > 1 && !t.interleaves())
    throw ConfigError("--virtual-stages " + std::to_string(v) + " places several stages on each rank, which only " +
                      "interleaved does (the schedule is " + name_ + ")");
  c.virtual_stages_ = v > 0 ? v : std::max(t.default_virtual_stages, 1);
  return c;
}

ScheduleChoice ScheduleChoice::from_actions(const std::string& name, const std::string& text) {
  ScheduleChoice c;
  c.name_ = name;
  c.text_ = text;
  c.file_ = std::make_shared<const Schedule>(parse_schedule_file(name, text));
  for (const std::vector<Action>& list : c.file_->actions)
    for (const Action& a : list) c.file_traits_.splits_backward |= a.kind == ActionKind::BackwardInput;
  return c;
}

const ScheduleTraits& ScheduleChoice::traits() const {
  if (file_) return file_traits_;
  const ScheduleEntry* e = find_registered(name_);
  if (!e) throw std::logic_error("schedule '" + name_ + "' is not resolved to a registered one");
  return e->traits;
}

Schedule ScheduleChoice::make(int stages, int64_t micro_batches) const {
  check_sizes(stages, micro_batches);
  if (file_) {
    if (file_->stages != stages)
      throw ConfigError("schedule " + name_ + " has lists for " + std::to_string(file_->stages) +
                        " stages; the run has " + std::to_string(stages));
    if (file_->micro_batches != micro_batches)
      throw ConfigError("schedule " + name_ + " runs " + std::to_string(file_->micro_batches) +
                        " micro-batches per step; the run has " + std::to_string(micro_batches) + " (--micro-batches)");
    return *file_;
  }
  const ScheduleEntry* e = find_registered(name_);
  if (!e) throw std::logic_error("schedule '" + name_ + "' is not resolved to a registered one");
  if (stages % virtual_stages_ != 0)
    throw ConfigError(std::to_string(stages) + " stages cannot be placed " + std::to_string(virtual_stages_) +
                      " on each rank (--virtual-stages)");
  Schedule s{name_, stages, micro_batches,
             e->generate(ScheduleShape{stages / virtual_stages_, virtual_stages_, micro_batches}),
             e->traits.sends_in_flight};
  add_communication(s);
  return s;
}

ScheduleRequest ScheduleRequest::named(const std::string& name) {
  if (name != "auto") return ScheduleRequest(ScheduleChoice::named(name));
  ScheduleRequest r;
  r.automatic_ = true;
  return r;
}

const ScheduleChoice& ScheduleRequest::choice() const {
  if (automatic_) throw std::logic_error("--schedule auto names no schedule until the planner resolves it");
  return choice_;
}

ScheduleRequest ScheduleRequest::with_virtual_stages(int v) const {
  if (v < 0) throw ConfigError("--virtual-stages must be at least 1");
  ScheduleRequest r = *this;
  if (automatic_)
    r.given_virtual_stages_ = v;
  else
    r.choice_ = choice_.with_virtual_stages(v);
  return r;
}

int ScheduleRequest::virtual_stages() const {
  return automatic_ ? std::max(given_virtual_stages_, 1) : choice_.virtual_stages();
}

std::vector<ScheduleChoice> ScheduleRequest::candidates() const {
  if (!automatic_) return {choice_};
  std::vector<ScheduleChoice> out;
  for (const ScheduleEntry& e : registered_schedules())
    if (e.traits.updates_once_per_step)
      out.push_back(
          ScheduleChoice::named(e.name).with_virtual_stages(e.traits.interleaves() ? given_virtual_stages_ : 0));
  return out;
}

bool ScheduleRequest::admits(const ScheduleChoice& planned) const {
  return automatic_ || (choice_.name() == planned.name() && choice_.actions_text() == planned.actions_text());
}

template <>
ScheduleChoice from_name<ScheduleChoice>(const std::string& name) {
  return ScheduleChoice::named(name);
}

template <>
ScheduleRequest from_name<ScheduleRequest>(const std::string& name) {
  return ScheduleRequest::named(name);
}

std::string schedule_choices() {
  const std::vector<ScheduleEntry>& entries = registered_schedules();
  std::string text;
  for (size_t i = 0; i < entries.size(); ++i)
    text += (i == 0 ? "" : i + 1 == entries.size() ? " or " : ", ") + std::string(entries[i].name);
  return text;
}

std::string schedule_help() {
  std::string text;
  for (const ScheduleEntry& e : registered_schedules()) text += std::string(e.name) + " (" + e.summary + "), ";
  return text +
         "auto (the fastest predicted step that fits, of the synchronous ones) or file:PATH (one line of "
         "actions per stage, e.g. 0F0 0F1 0B0 0B1 0U)";
}

Schedule make_schedule(const std::string& name, int stages, int64_t micro_batches) {
  return ScheduleChoice::named(name).make(stages, micro_batches);
}

}  // namespace dawnpiper
