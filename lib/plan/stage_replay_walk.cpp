// A micro-batch's forward and backward walked node by node (plan/stage_replay.h).
#include "plan/stage_replay.h"

namespace dawnpiper {
namespace detail {

void StageReplay::forward(int64_t mb, MicroBatch& m) {
  if (stashes_) {
    m.version = version_;
    if (version_users_[version_]++ == 0) live_ += weights_;  // the stashed copy
  }
  walk_once(forward_walk_, m, /*backward=*/false, [&] { forward_nodes(mb, m); });
}

void StageReplay::forward_nodes(int64_t mb, MicroBatch& m) {
  for (int t : data_) m.alive[loc(t)] = 1, live_ += bytes(t);
  note(live_, -1);
  for (int n = b_; n < e_; ++n) {
    const NodeProfile& node = p_.nodes[at(n)];
    if (model_.node_class(n) == NodeClass::Input) continue;
    if (zero_gathers()) gather_forward(n);
    int64_t out = 0;
    for (int t : node.outputs)
      if (allocates(t)) out += bytes(t);
    note(live_ + out + node.fwd_workspace - overwritten_logits(m, n), n);
    live_ += out;
    for (int t : node.outputs) {
      if (!allocates(t)) continue;
      m.alive[loc(t)] = 1;
      if (m.refs[loc(t)] == 0) m.alive[loc(t)] = 0, live_ -= bytes(t);
    }
    for (int i : evict_after_[at(n - b_)]) evict(m, mb, i);
    if (zero_gathers()) after_forward_node(n);
    for (int t : model_.inputs(n)) release(m, key_[at(t)]);
  }
  for (int t : data_read_later_) release(m, t);
}

// The zoo's loss writes fp32 log-probabilities over its logits when its executor holds the only
// handle on them (exec/stage_module.cpp), saving all but one chunk of rows of them. Not where
// the profile does not show fp32, contiguous logits (loss_inputs).
void StageReplay::find_loss() {
  for (int n = b_; n < e_; ++n) {
    if (model_.node_class(n) != NodeClass::InPlaceLoss) continue;
    const LossInputs in = loss_inputs(p_, n, model_.inputs(n));
    if (!in.fp32) continue;
    loss_node_ = n, loss_logits_ = in.logits;
    loss_saving_ = cross_entropy_overwrite_saving(bytes(key_[at(in.logits)]), bytes(in.labels));
  }
}

// In a forward, the logits die at the loss (no later reader, saver, send or recompute leaf holds
// their storage) and were not received (the stage holds those until their gradient is sent).
int64_t StageReplay::overwritten_logits(const MicroBatch& m, int n) const {
  if (n != loss_node_) return 0;
  const int k = key_[at(loss_logits_)];
  if (is_received_[at(k)] || !m.alive[loc(k)] || m.evicted[loc(k)] || m.refs[loc(k)] != 1) return 0;
  return loss_saving_;
}

void StageReplay::backward(int64_t mb, MicroBatch& m) {
  if (begin_weight_pass())  // (walked apart from the repeated walks)
    backward_nodes(mb, m);
  else
    walk_once(backward_walk_[backward_in_step_ ? 1 : 0], m, /*backward=*/true, [&] { backward_nodes(mb, m); });
  backward_in_step_ = true;
  if (stashes_ && --version_users_[m.version] == 0) {
    version_users_.erase(m.version);
    live_ -= weights_;
  }
}

void StageReplay::backward_nodes(int64_t mb, MicroBatch& m, bool input_only) {
  size_t next_due = 0;
  // The loss's stage starts its backward (B or I) from the loss times the schedule's scale, with
  // a seed gradient of ones (runtime/pipeline_stage.cpp): both live until it ends, and the
  // loss's own gradient until the loss's backward has run.
  const int64_t roots = last_ ? 2 * bytes(loss_) : 0;
  const int loss_producer = last_ ? p_.tensors[at(loss_)].producer : -1;
  live_ += roots;
  if (input_only && zero_gathers()) input_pass_begins();
  for (int i = e_ - 1; i >= b_; --i) {
    if (!model_.has_backward(i)) continue;
    // Autograd runs in I only what leads to a tracked input: the rest waits for W.
    if (!input_only || !weight_only_[at(i - b_)]) restore_for(m, mb, i, next_due);
    if (zero_gathers()) gather_backward(i, input_only);  // where its output's gradient arrives
    if (input_only && zero_gathers()) readers_ran(i);
    const int64_t loss_grad = i == loss_producer ? bytes(loss_) : 0;
    live_ += loss_grad;
    backward_node(m, i, input_only);
    live_ -= m.wholes_due[at(i - b_)];
    m.wholes_due[at(i - b_)] = 0;
    if (loss_grad > 0 && input_only && reads_params_[at(i - b_)])
      m.held_for_weights[at(i - b_)] += loss_grad;  // a fused head's W starts from it
    else
      live_ -= loss_grad;
  }
  // A received tensor relayed as it is, read by nothing here: its gradient is the one received,
  // held until sent back.
  for (const TensorBytes& s : sent_)
    if (is_received_[at(s.tensor)] && m.has_grad[loc(s.tensor)] == 2) {
      m.received_grads -= s.bytes;
      m.input_grads += s.bytes;
    }
  for (const TensorBytes& s : sent_)  // received gradients the stage holds with others (input_gradients)
    if (m.has_grad[loc(s.tensor)] == 2 && m.grad_owner[loc(s.tensor)] >= 0) live_ -= gradient_released(m, s.tensor);
  live_ -= m.received_grads + roots + m.slices_until_input_end;
  m.received_grads = m.slices_until_input_end = 0;
  if (!input_only) {
    release_graph(m);
    zero_end_micro_batch();
    if (zero_gathers()) release_gathered();
    return;
  }
  // I kept the graph while it ran; what the parameter readers saved stays for W, and so do the
  // log-probabilities holding the logits' gradient that a reader holds (loss_grad_held).
  for (int i = e_ - 1; i >= b_; --i)
    if (model_.has_backward(i) && !reads_params_[at(i - b_)])
      for (int t : p_.nodes[at(i)].saved)
        if (!((m.loss_grad_held || m.loss_saved_released) && i == loss_node_ && model_.is_internal(t)))
          for_saver_keys(t, [&](int k) { release(m, k); });
  // Level 3: I gathered every bucket a node whose output got a gradient reads (their functions
  // read the weights), and lets them all go at its end; W gathers each node's again.
  if (zero_gathers()) release_gathered();
}

void StageReplay::release_graph(MicroBatch& m) {
  if (m.weights_pending)  // I kept what the parameter readers saved
    for (int i = e_ - 1; i >= b_; --i)
      if (model_.has_backward(i) && reads_params_[at(i - b_)])
        for (int t : p_.nodes[at(i)].saved) for_saver_keys(t, [&](int k) { release(m, k); });
  for (const TensorBytes& s : sent_) release(m, key_[at(s.tensor)]);
  if (last_ && --m.refs[loc(loss_)] == 0 && m.alive[loc(loss_)]) m.alive[loc(loss_)] = 0, m.loss_pending = true;
  if (m.weights_pending && m.gradients_sent)
    for (const TensorBytes& t : received_)
      if (requires_grad_[at(t.tensor)]) release(m, t.tensor);
}

// W: each parameter-reading node whose output got a gradient makes its parameters' gradients
// from it (in the backward's order, as the runtime's weight pass runs), then lets it go.
void StageReplay::weight_nodes(int64_t mb, MicroBatch& m) {
  size_t next_due = 0;
  for (int i = e_ - 1; i >= b_; --i) {
    const int64_t held = m.held_for_weights[at(i - b_)];
    if (held < 0) continue;
    if (weight_only_[at(i - b_)]) restore_for(m, mb, i, next_due);  // what I left evicted
    if (zero_gathers()) gather_backward(i, false);
    int64_t grads = 0, transient = tied_sum_at_[at(i - b_)];
    param_gradient(i, grads, transient);
    note(live_ + grads + transient + p_.nodes[at(i)].bwd_workspace, i);
    live_ += grads;
    if (zero_gathers()) gather_released(i);
    if (zero_streaming()) zero_gradient_made(i);  // (the weight pass still holds the output's gradient)
    average_gradient_made(i);
    live_ -= held;
    for (int o : p_.nodes[at(i)].outputs)  // held with other holders (input_gradients' passes)
      if (!model_.is_internal(o) && m.grad_owner[loc(o)] >= 0) live_ -= gradient_released(m, o);
  }
  if (m.loss_grad_held)
    for (int t : p_.nodes[at(loss_node_)].saved)
      if (model_.is_internal(t)) for_saver_keys(t, [&](int k) { release(m, k); });
  m.loss_grad_held = false;
  average_pass_end();  // (the runtime's W lets its graph go after)
  release_graph(m);
  m.weights_pending = false;
  zero_end_micro_batch();
  if (zero_gathers()) release_gathered();
}

// Node i's backward: the gradients of its inputs and parameters appear, its output's gradient
// is consumed, what it saved is released.
// A node whose backward slices the gradient it made (find_sliced_gradients): its inputs get
// slices, the received ones copies held until sent back. (I captures the received ones' slices
// and copies them at its end: the whole lives until then.)
void StageReplay::backward_slices(MicroBatch& m, int i, bool input_only) {
  const int out = model_.graph_output(i);
  int64_t copies = 0;  // received inputs' gradients, held until sent back
  for (int t : model_.inputs(i)) {
    m.has_grad[loc(t)] = is_received_[at(t)] ? 1 : 3;
    if (is_received_[at(t)]) copies += bytes(t);
  }
  note(live_ + copies + p_.nodes[at(i)].bwd_workspace, i);
  live_ += copies;
  m.input_grads += copies;
  if (slices_gradient_[at(i - b_)] != 2 || m.grad_in_loss[loc(out)]) return;
  if (input_only)
    m.slices_until_input_end += bytes(out);
  else
    live_ -= bytes(out);
}

// Whether the slices of concat node c's gradient that W holds (those of its inputs made by
// parameter readers) are all of it: else the input pass copies them (exec/split_backward.cpp).
bool StageReplay::held_slices_cover(int c) const {
  for (int t : model_.inputs(c)) {
    const int producer = p_.tensors[at(t)].producer;
    if (!in_range(producer) || !reads_params_[at(producer - b_)]) return false;
  }
  return true;
}

// What node i's backward gives its inputs: new gradients, sums into existing ones, or (a view)
// its output's gradient handed on.
StageReplay::InputGradients StageReplay::input_gradients(MicroBatch& m, int i, bool view, bool input_only) {
  const NodeClass kind = model_.node_class(i);
  const int out = model_.graph_output(i);
  const char out_grad = m.has_grad[loc(out)];
  InputGradients r;
  // A view's gradient goes to the tensor it views alone: type_as, expand_as and view_as read
  // another tensor only for its type or shape.
  const int viewed = view ? p_.tensors[at(out)].alias_of : -1;
  // Hands its output's gradient itself to its inputs: one buffer, theirs too. The output's is one
  // this backward made, or one received for it (the stage's hold on it one holder more, let go
  // where the backward ends). Not where the node reads parameters (I would hold it for W).
  const bool received_for_out =
      out_grad == 2 && std::any_of(sent_.begin(), sent_.end(), [&](const TensorBytes& s) { return s.tensor == out; });
  const bool passes = !view && p_.nodes[at(i)].passes_gradient && (out_grad == 1 || received_for_out) &&
                      !m.grad_in_loss[loc(out)] && !reads_params_[at(i - b_)];
  for (int t : model_.inputs(i)) {
    if (!requires_grad_[at(t)] || (viewed >= 0 && t != viewed)) continue;
    char& g = m.has_grad[loc(t)];
    if (g && !view && gradient_shared(m, t)) {
      // Summed into a buffer another holder has: autograd sums in place only into the existing
      // gradient, so the sum is a new buffer, beside this node's contribution until it is made.
      gradient_released(m, t);
      if (!passes) r.transient += bytes(t);
      r.grads += bytes(t);
      m.grad_views[loc(t)] = 0;
      continue;
    }
    if (g) {  // this node's contribution is summed into the existing gradient
      if (view) {
        // A view of the output's gradient, summed in place into an existing gradient that alone
        // holds its storage; else into a new buffer: beside a received gradient the stage holds
        // until the backward ends (Mixtral's hidden states, sent on and read by its router), or
        // beside a view.
        if (g == 2) {
          r.grads += bytes(t), g = 1;
          if (is_received_[at(t)]) m.input_grads += bytes(t);
        } else if (m.grad_views[loc(t)]) {
          r.transient += bytes(t);
        }
        m.grad_views[loc(t)] = 0;
        continue;
      }
      // Autograd sums in place only into the existing gradient, and only where it alone holds
      // its storage, which a view made in the backward does not: the view keeps its base alive.
      // A linear's input gradient views its 2-D product where it folds the batch (an input of
      // more than two dimensions, as in every transformer), a reshape's views its output's. A
      // sum into such is a new buffer beside both; later sums go into it (T5's q, k and v
      // projections). A passed gradient (held by the output too) is no new buffer.
      if (!passes) r.transient += bytes(t);
      if (g == 1 && m.grad_views[loc(t)]) r.transient += bytes(t);
      m.grad_views[loc(t)] = 0;
      if (g == 2) {  // out of place: the stage still holds the received one
        r.grads += bytes(t), g = 1;
        // A tensor relayed to the next stage and read here: the sum is what goes back.
        if (is_received_[at(t)]) m.input_grads += bytes(t);
      }
      continue;
    }
    r.passed_on = true;
    // (A received input's gradient in I is captured as it is, and sent so: send_grad. A whole
    // backward accumulates it into the received leaf, which copies a buffer others hold.)
    if (passes && (input_only || !is_received_[at(t)]) && bytes(t) == bytes(out)) {  // one more holder
      if (is_received_[at(t)]) m.input_grads += bytes(t);
      if (m.grad_owner[loc(out)] < 0) {
        m.grad_owner[loc(out)] = out, m.grad_holders[loc(out)] = 1;
        if (out_grad == 2) m.received_grads -= bytes(out);  // (released as a holder: backward_nodes)
      }
      const int owner = m.grad_owner[loc(out)];
      m.grad_owner[loc(t)] = owner;
      ++m.grad_holders[loc(owner)];
      g = 1;
      m.grad_views[loc(t)] = m.grad_views[loc(out)];
      m.permuted[loc(t)] = m.permuted[loc(out)];
      continue;
    }
    if (is_received_[at(t)]) m.input_grads += bytes(t);  // held until sent back
    if (!view) {
      g = 1, r.grads += bytes(t);
      m.grad_views[loc(t)] = kind == NodeClass::Linear;
    } else if (kind == NodeClass::Reshape && m.permuted[loc(out)]) {
      g = 1, r.grads += bytes(t), r.copied_view = true;  // a permuted gradient is not viewable
    } else {                                             // a view of the output's gradient, with its owner
      g = out_grad ? out_grad : 1;
      if (out_grad == 1) std::swap(m.grad_owner[loc(t)], m.grad_owner[loc(out)]);  // (t's is -1)
      // A received tensor relayed as a view: its gradient is a view of the received one, which is
      // then held until sent back (input_grads), not freed when the backward ends.
      if (out_grad == 2 && is_received_[at(t)]) m.received_grads -= bytes(t);
      // In I, a received gradient in its tensor's own (permuted) layout, permuted back, is dense
      // in the order the view's input has: the view before it hands it on (measured; a whole
      // backward copies it, as counted).
      const bool relaid =
          input_only && out_grad == 2 && std::binary_search(relaid_grads_.begin(), relaid_grads_.end(), out);
      m.permuted[loc(t)] = !relaid && (m.permuted[loc(out)] || kind == NodeClass::Permute);
      m.grad_views[loc(t)] = 1;
      m.grad_in_loss[loc(t)] = m.grad_in_loss[loc(out)];  // an imported head's reshape of the logits
    }
  }
  return r;
}

// B: the node's whole-backward workspace, measured as a whole backward lets the graph go (a node of
// several autograd functions frees what each saved as it goes: GPT-2's attention with dropout on
// CPU, 128 KiB). I: the larger of that and its I workspace; I keeps what those functions saved
// until its end (384 KiB for that attention). (Charged the larger in B too, that GPT-2's
// interleaved ranks measured up to 6.8% below their replay.)
int64_t StageReplay::backward_workspace(const NodeProfile& node, bool input_only) {
  return input_only ? std::max(node.bwd_workspace, input_workspace(node)) : node.bwd_workspace;
}

// A slice of a concat's gradient (find_sliced_gradients), which is not contiguous, as node i's
// backward reads it:
// - a linear's reshapes it first, a copy, in an autograd function of its own: the copy of the
//   last slice read frees the whole gradient before the product runs;
// - a slice's, expand's or split's scatters or sums it as it is, no copy: the last frees the
//   whole once its input's gradient is made (freed_after; Llama's rotary halves);
// - other kernels (a convolution's) copy it inside their function: the last frees the whole at
//   its end.
// I holds the slices for W: the whole gradient lives until then (freed at this node's W).
// Where W's readers hold slices that do not cover the whole, I copies them at its end and lets
// the whole go then (exec/split_backward.cpp): each reader holds its copy, counted from here.
void StageReplay::concat_slice_gradient(MicroBatch& m, int i, bool input_only, int64_t& transient, int64_t& slices_held,
                                        int64_t& slice_copy, int64_t& freed_after) {
  const bool holds = input_only && reads_params_[at(i - b_)];
  const int out = model_.graph_output(i);
  const NodeClass kind = model_.node_class(i);
  if (kind != NodeClass::ViewAllocatingGradient) transient += bytes(out);
  const bool copied = holds && !held_slices_cover(p_.tensors[at(out)].consumers.front());
  if (copied) slice_copy = bytes(out);
  if (frees_slices_of_[at(i - b_)] >= 0) {
    const int concat = model_.graph_output(frees_slices_of_[at(i - b_)]);
    const int64_t whole = bytes(concat);
    if (copied) {  // (in the loss's log-probabilities: those go at I's end with its saved tensors)
      if (!m.grad_in_loss[loc(concat)]) m.slices_until_input_end += whole;
    } else if (holds && m.grad_in_loss[loc(concat)]) {
      m.loss_grad_held = true;
    } else if (holds) {
      slices_held = whole;
    } else if (m.grad_in_loss[loc(concat)]) {  // freed with the loss's log-probabilities
    } else if (whole_goes_later(m, frees_slices_of_[at(i - b_)], i, input_only, whole)) {
    } else if (kind == NodeClass::Linear) {
      note(live_ + bytes(out), i);
      live_ -= whole;
    } else {
      freed_after = whole;
    }
  }
}

// I's loss node: where the logits' gradient goes (reused: the log-probabilities' bytes).
void StageReplay::loss_gradient_in_input_pass(MicroBatch& m, const NodeProfile& node, int64_t reused) {
  if (is_received_[at(key_[at(loss_logits_)])]) {
    // Received logits: their gradient goes back in the log-probabilities' buffer, which it
    // owns from here, as in a whole backward.
    for (int t : node.saved)
      if (model_.is_internal(t)) for_saver_keys(t, [&](int k) { release(m, k); });
    m.loss_saved_released = true;
  } else {  // no storage of its own
    live_ -= reused;
    m.grad_in_loss[loc(loss_logits_)] = 1;
  }
}

void StageReplay::backward_node(MicroBatch& m, int i, bool input_only) {
  const NodeProfile& node = p_.nodes[at(i)];
  const NodeClass kind = model_.node_class(i);
  const int out = model_.graph_output(i);
  // Slices of the gradient it made (not of one other holders have: else new buffers, as a rule).
  if (slices_gradient_[at(i - b_)] && m.has_grad[loc(out)] == 1 && m.grad_owner[loc(out)] < 0) {
    backward_slices(m, i, input_only);
    return;
  }
  // A view hands its output's gradient on as a view, unless its backward allocates one of the
  // input's size (slices, expands, splits).
  const bool view = !model_.owns_storage()[at(out)] && kind != NodeClass::ViewAllocatingGradient;
  const char out_grad = m.has_grad[loc(out)];
  InputGradients in = input_gradients(m, i, view, input_only);
  int64_t grads = in.grads, transient = in.transient;
  const bool passed_on = in.passed_on, copied_view = in.copied_view;
  // I holds a parameter-reading node's output gradient for W: nothing is written over it.
  const bool holds = input_only && reads_params_[at(i - b_)];
  // A view of a parameter (Falcon's transposed weights), or summed into a gradient: the
  // gradient is done with, but that of a parameter's view, which I holds for W.
  const bool param_view_grad = view && !passed_on && out_grad == 1;
  if (param_view_grad && !holds) live_ -= gradient_released(m, out);
  if (!input_only) {
    param_gradient(i, grads, transient);
    transient += tied_sum_at_[at(i - b_)];
  }
  // Written over the output's gradient, which the stage made: no new storage for the input's.
  int64_t reused = 0;
  if (in_place_grad_[at(i - b_)] && out_grad == 1 && m.grad_owner[loc(out)] < 0 &&
      requires_grad_[at(model_.inputs(i)[0])] && !holds)
    reused = bytes(model_.inputs(i)[0]);
  // The loss writes the logits' gradient over its log-probabilities (fp32).
  if (i == loss_node_ && requires_grad_[at(loss_logits_)]) reused = bytes(loss_logits_);
  int64_t slices_held = 0, slice_copy = 0, freed_after = 0;
  if (out >= 0 && m.has_grad[loc(out)] == 3)
    concat_slice_gradient(m, i, input_only, transient, slices_held, slice_copy, freed_after);
  note(live_ + grads + transient + backward_workspace(node, input_only) - reused, i);
  live_ += grads - freed_after;
  if (input_only && i == loss_node_ && reused > 0) loss_gradient_in_input_pass(m, node, reused);
  if (holds) {
    // W runs from here (also from a loss: backward_nodes holds its gradient).
    int64_t& held = m.held_for_weights[at(i - b_)];
    held = std::max<int64_t>(held, 0) + slices_held + slice_copy;
    live_ += slice_copy;
    for (int o : node.outputs) {
      if (model_.is_internal(o) || is_received_[at(o)] || !m.has_grad[loc(o)]) continue;
      if (m.grad_in_loss[loc(o)]) {  // in the loss's log-probabilities
        m.loss_grad_held = true;
        continue;
      }
      if (m.has_grad[loc(o)] == 2) {  // a received gradient: held past the end of I
        held += bytes(o);
        m.received_grads -= bytes(o);
      } else if (m.has_grad[loc(o)] == 1 && (!view || copied_view || (param_view_grad && o == out))) {
        if (m.grad_owner[loc(o)] < 0) held += bytes(o);  // (else a holder until W: weight_nodes)
      }
    }
    return;  // what it saved stays for W
  }
  // The graph outputs' gradients have been consumed (a concat's lives on in slices:
  // find_concat_wholes).
  for (int o : node.outputs)
    if (!model_.is_internal(o) && m.has_grad[loc(o)] == 1 && (!view || copied_view) && !is_received_[at(o)] &&
        !m.grad_in_loss[loc(o)] &&  // (that one goes with the loss's log-probabilities)
        !(m.grad_owner[loc(o)] < 0 && whole_goes_later(m, i, i, input_only, bytes(o))))
      live_ -= gradient_released(m, o);
  if (!input_only)  // I lets them go at its end (backward_nodes)
    for (int t : node.saved) for_saver_keys(t, [&](int k) { release(m, k); });
  // Autograd accumulates the parameters' gradients once the node's function has let its
  // inputs and saved tensors go.
  if (!input_only && zero_gathers()) gather_released(i);
  if (!input_only && zero_streaming()) zero_gradient_made(i);
  if (!input_only) average_gradient_made(i);
}

// Concat c's whole gradient, let go at node i by the rules of find_sliced_gradients: kept until
// I ends or until a later node's backward (find_concat_wholes), or false (it goes at i).
bool StageReplay::whole_goes_later(MicroBatch& m, int c, int i, bool input_only, int64_t whole) {
  if (input_only && whole_held_in_input_[at(c - b_)]) {
    m.slices_until_input_end += whole;
    return true;
  }
  const int after = whole_freed_after_[at(c - b_)];
  if (after < 0 || after == i) return false;
  m.wholes_due[at(after - b_)] += whole;
  return true;
}

int64_t StageReplay::gradient_released(MicroBatch& m, int t) {
  const int owner = m.grad_owner[loc(t)];
  if (owner < 0) return bytes(t);
  m.grad_owner[loc(t)] = -1;
  if (--m.grad_holders[loc(owner)] > 0) return 0;
  if (!m.grad_sent[loc(owner)]) return bytes(owner);
  m.grad_sent[loc(owner)] = 0;  // a send holds it too: settled after W (settle_sent_gradients)
  m.send_held_freed += bytes(owner);
  return 0;
}

void StageReplay::param_gradient(int i, int64_t& grads, int64_t& transient) {
  const int64_t pg = grad_at_[at(i - b_)];
  if (!grad_done_[at(i - b_)] || zero_streamed(i)) {  // (level 2: released after each micro-batch)
    grad_done_[at(i - b_)] = 1;
    grads += pg;
    param_grads_ += pg;
  } else {  // accumulated into the existing gradient
    const int64_t held = hold_from_[at(i - b_)], summed = hold_to_[at(i - b_)];
    transient += pg - held + summed;
    grads += held;
    live_ -= summed;
  }
}

}  // namespace detail
}  // namespace dawnpiper
