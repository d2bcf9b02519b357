#pragma once
// One instruction of a pipeline stage: what a rank does next. A schedule is a list of these per
// stage; the runtime executes the lists and the planner simulates the very same lists to know how
// many micro-batches and weight versions each stage holds (schedule/simulate.h).
//
// Compact text form (as in torch.distributed.pipelining): stage, kind, micro-batch, e.g.
//   2F0  stage 2 forward of micro-batch 0      2B0        backward of micro-batch 0
//   2I0  input-gradient half of 2B0            2W0        its weight-gradient half (after 2I0)
//   2U   optimizer step (weight update)        1SEND_F3   send activations of mb 3 downstream
//   1RECV_F3 / 1SEND_B3 / 1RECV_B3             activations in, gradients out / in
//   0SWAP_OUT2t17, 0SWAP_IN2t17, 0RECOMPUTE2t17  evictor actions for tensor 17 of mb 2
//   2REDUCE_TIED  tied-weight gradients summed across stages (before 2U)
#include <cstdint>
#include <string>
#include <vector>

#include "util/enum_names.h"

namespace dawnpiper {

enum class ActionKind {
  Forward,
  Backward,
  // The backward split in two (zero-bubble schedules): BackwardInput computes the gradients of
  // the stage's inputs (what the previous stage waits for) and holds what the weights' gradients
  // still need; BackwardWeight, later, computes those. A micro-batch has a Backward or both.
  BackwardInput,
  BackwardWeight,
  SendActivation,  // to stage + 1, after Forward
  RecvActivation,  // from stage - 1, before Forward
  SendGrad,        // to stage - 1, after Backward or BackwardInput
  RecvGrad,        // from stage + 1, before Backward or BackwardInput
  OptimizerStep,   // no micro-batch
  // Reserved for the runtime's evictor (the generators never emit them).
  SwapOut,
  SwapIn,
  Recompute,
  // Reserved for the runtime: averaging a stage's gradients over its data-parallel replicas,
  // inside the optimizer step.
  AllReduce,
  // Summing the gradients of weights tied across stages with the other stages holding them,
  // before a synchronous optimizer step (DeepSpeed's ReduceTiedGrads); no micro-batch.
  ReduceTiedGrads,
};
// The codes of the text form (name_of, from_name), longest first: parse_action matches prefixes.
template <>
struct EnumNames<ActionKind> {
  static constexpr const char* what = "action kind";
  static constexpr std::array<std::pair<ActionKind, const char*>, 14> table{{
      {ActionKind::ReduceTiedGrads, "REDUCE_TIED"},
      {ActionKind::AllReduce, "ALLREDUCE"},
      {ActionKind::SwapOut, "SWAP_OUT"},
      {ActionKind::SwapIn, "SWAP_IN"},
      {ActionKind::Recompute, "RECOMPUTE"},
      {ActionKind::SendActivation, "SEND_F"},
      {ActionKind::RecvActivation, "RECV_F"},
      {ActionKind::SendGrad, "SEND_B"},
      {ActionKind::RecvGrad, "RECV_B"},
      {ActionKind::Forward, "F"},
      {ActionKind::Backward, "B"},
      {ActionKind::BackwardInput, "I"},
      {ActionKind::BackwardWeight, "W"},
      {ActionKind::OptimizerStep, "U"},
  }};
};

struct Action {
  ActionKind kind = ActionKind::Forward;
  int stage = 0;
  int64_t micro_batch = -1;  // -1 for OptimizerStep
  int tensor = -1;           // SwapOut / SwapIn / Recompute only

  bool operator==(const Action& o) const {
    return kind == o.kind && stage == o.stage && micro_batch == o.micro_batch && tensor == o.tensor;
  }
  bool operator!=(const Action& o) const { return !(*this == o); }
};

// Backward or BackwardInput: the backward that hands gradients to the previous stage.
inline bool passes_gradient_back(ActionKind kind) {
  return kind == ActionKind::Backward || kind == ActionKind::BackwardInput;
}

// B, I or W: a part of some micro-batch's backward.
inline bool is_backward(ActionKind kind) { return passes_gradient_back(kind) || kind == ActionKind::BackwardWeight; }

// Actions of the whole step, not of one micro-batch (U, REDUCE_TIED, ALLREDUCE).
bool per_step(ActionKind kind);

std::string to_string(const Action& action);
// Space-separated compact forms.
std::string to_string(const std::vector<Action>& actions);
// Inverse of to_string(const Action&); throws ConfigError on malformed text.
Action parse_action(const std::string& text);
// Whitespace-separated list of compact forms.
std::vector<Action> parse_actions(const std::string& text);

}  // namespace dawnpiper
