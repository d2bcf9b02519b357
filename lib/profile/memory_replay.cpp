#include "profile/memory_replay.h"

#include <algorithm>
#include <vector>

namespace dawnpiper {

ReplayResult replay_step(const Profile& p, const std::string& optimizer) {
  const int T = static_cast<int>(p.tensors.size());
  auto owner = [&](int t) {
    while (p.tensors[t].alias_of >= 0) t = p.tensors[t].alias_of;
    return t;
  };
  // A storage is released once every forward reader of it (or of a view of it) has run and
  // every backward that saved it has run.
  std::vector<int> refs(T, 0);
  for (const TensorProfile& t : p.tensors) {
    refs[owner(t.id)] += static_cast<int>(t.consumers.size());
    refs[owner(t.id)] += static_cast<int>(t.saved_by.size());
  }
  const int loss = p.size() - 1;
  for (int t : p.nodes[loss].outputs) refs[t] += 1;  // the loss value is read after backward
  std::vector<bool> alive(T, false);
  std::vector<std::vector<int>> inputs(p.size());
  for (const TensorProfile& t : p.tensors)
    for (int c : t.consumers) inputs[c].push_back(t.id);
  // Gradients flow through outputs of nodes with parameters or with such inputs.
  std::vector<bool> requires_grad(T, false);
  for (const NodeProfile& n : p.nodes) {
    bool rg = (n.param_bytes > 0 || n.param_grad_bytes > 0) && n.kind != "input";
    for (int t : inputs[n.id]) rg = rg || requires_grad[t];
    for (int t : n.outputs)
      requires_grad[t] =
          p.tensors[t].requires_grad >= 0 ? p.tensors[t].requires_grad == 1 : rg && !p.tensors[t].internal;
  }

  ReplayResult r;
  r.static_bytes = p.total_param_bytes() * (1 + Profile::optimizer_state_multiplier(optimizer));
  int64_t live = r.static_bytes;
  auto note_peak = [&](int64_t value, int node, bool backward) {
    if (value > r.peak_bytes) {
      r.peak_bytes = value;
      r.peak_node = node;
      r.peak_in_backward = backward;
    }
  };
  auto release = [&](int t) {
    int o = owner(t);
    if (--refs[o] == 0 && alive[o]) {
      alive[o] = false;
      live -= p.tensors[o].bytes;
    }
  };
  // Data is loaded before the forward pass.
  for (const TensorProfile& t : p.tensors)
    if (t.is_data) alive[t.id] = true, live += t.bytes;
  note_peak(live, 0, false);
  for (const NodeProfile& n : p.nodes) {
    if (n.kind == "input") continue;
    int64_t held = 0;
    for (int t : n.outputs)
      if (p.tensors[t].owns_storage()) held += p.tensors[t].bytes;
    note_peak(live + held + n.fwd_workspace, n.id, false);
    for (int t : n.outputs)
      if (p.tensors[t].owns_storage()) alive[t] = true;
    live += held;
    for (int t : inputs[n.id]) release(t);
  }
  r.forward_end_bytes = live;
  // Backward, in reverse: each node's backward turns its output gradient into input gradients
  // (views pass theirs through without allocating) and parameter gradients, then drops what it
  // saved.
  std::vector<bool> has_grad(T, false);
  for (int i = p.size() - 1; i >= 0; --i) {
    const NodeProfile& n = p.nodes[i];
    if (n.kind == "input") continue;
    std::vector<int> outs;  // graph outputs (internal buffers follow them)
    bool any_grad = false;
    for (int t : n.outputs)
      if (!p.tensors[t].internal) outs.push_back(t), any_grad = any_grad || requires_grad[t];
    if (!any_grad) continue;
    const bool view = !p.tensors[outs[0]].owns_storage() && !view_allocates_gradient(n.kind);
    int64_t grads = 0;
    for (int t : inputs[i])
      if (requires_grad[t] && !has_grad[t]) {
        has_grad[t] = true;
        if (!view) grads += p.tensors[t].bytes;
      }
    grads += n.param_grad_bytes;
    note_peak(live + grads + n.bwd_workspace, i, true);
    live += grads;
    for (int o : outs)
      if (has_grad[o] && !view) live -= p.tensors[o].bytes;  // output gradients consumed
    for (int t : n.saved) release(t);
  }
  // The optimizer step updates parameters in node order and frees each gradient after its
  // update; Adam needs one temporary the size of the parameter it updates (see
  // train/optimizer.cpp), bounded here by the node's parameter bytes.
  if (optimizer == "adam") {
    for (const NodeProfile& n : p.nodes) {
      if (n.param_bytes == 0) continue;
      note_peak(live + std::min(n.param_bytes, p.largest_param_bytes), n.id, true);
      live -= n.param_bytes;  // this node's gradients are released after its update
    }
  }
  r.activation_peak = r.peak_bytes - r.static_bytes;
  return r;
}

}  // namespace dawnpiper
