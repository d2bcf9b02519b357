#include "profile/profile.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "util/error.h"

namespace dawnpiper {

namespace {
int64_t bytes_at(const LinearFit& fit, int64_t batch) {
  return static_cast<int64_t>(std::llround(std::max(0.0, fit.at(batch))));
}
double ms_at(const LinearFit& fit, int64_t batch) { return std::max(0.0, fit.at(batch)); }
}  // namespace

double weight_share(const NodeProfile& node) {
  if (node.weight_share >= 0) return node.weight_share;
  return node.param_bytes > 0 || node.tied_owner >= 0 ? 0.5 : 0.0;
}

namespace {
// "aten::transpose.int" -> "aten::transpose"
std::string op_of(const std::string& kind) {
  return kind.substr(0, kind.find('.', kind.find("::") == std::string::npos ? 0 : kind.find("::")));
}
}  // namespace

bool imported_kind(const std::string& kind) { return kind.rfind("aten::", 0) == 0; }

NodeClass node_class(const std::string& kind) {
  static const std::map<std::string, NodeClass> classes{
      {"input", NodeClass::Input},
#ifdef DAWNPIPER_IN_PLACE_GRADIENTS
      {"softmax", NodeClass::InPlaceGradient},
#endif
      {"cross_entropy", NodeClass::InPlaceLoss},
      {"concat", NodeClass::Concat},
      {"aten::cat", NodeClass::Concat},
      {"aten::stack", NodeClass::Concat},  // its inputs' gradients: views too
      {"linear", NodeClass::Linear},
      {"aten::linear", NodeClass::Linear},
      {"transpose", NodeClass::Permute},
      {"aten::transpose", NodeClass::Permute},
      {"aten::permute", NodeClass::Permute},
      {"aten::t", NodeClass::Permute},
      {"aten::swapaxes", NodeClass::Permute},
      {"aten::movedim", NodeClass::Permute},
      {"reshape", NodeClass::Reshape},
      {"aten::reshape", NodeClass::Reshape},
      {"aten::view", NodeClass::Reshape},
      {"aten::_unsafe_view", NodeClass::Reshape},
      {"aten::flatten", NodeClass::Reshape},
      {"aten::slice", NodeClass::ViewAllocatingGradient},
      {"aten::select", NodeClass::ViewAllocatingGradient},
      {"aten::narrow", NodeClass::ViewAllocatingGradient},
      {"aten::expand", NodeClass::ViewAllocatingGradient},
      {"aten::split", NodeClass::ViewAllocatingGradient},
      {"aten::split_with_sizes", NodeClass::ViewAllocatingGradient},
      {"aten::unbind", NodeClass::ViewAllocatingGradient},
      {"aten::chunk", NodeClass::ViewAllocatingGradient},
      {"aten::as_strided", NodeClass::ViewAllocatingGradient},
      {"aten::diagonal", NodeClass::ViewAllocatingGradient},
      {"aten::unfold", NodeClass::ViewAllocatingGradient}};
  auto it = classes.find(op_of(kind));
  return it == classes.end() ? NodeClass::Other : it->second;
}

LossInputs loss_inputs(const Profile& profile, int node, const std::vector<int>& inputs) {
  const std::vector<int>& saved = profile.nodes[static_cast<size_t>(node)].saved;
  auto is_saved = [&](int t) {
    for (; t >= 0; t = profile.tensors[static_cast<size_t>(t)].alias_of)
      if (std::find(saved.begin(), saved.end(), t) != saved.end()) return true;
    return false;
  };
  LossInputs r;
  for (int t : inputs) (is_saved(t) ? r.labels : r.logits) = t;
  if (inputs.size() != 2 || r.logits < 0 || r.labels < 0) return LossInputs{};
  const TensorProfile& logits = profile.tensors[static_cast<size_t>(r.logits)];
  for (int t : profile.nodes[static_cast<size_t>(node)].outputs) {
    const TensorProfile& buffer = profile.tensors[static_cast<size_t>(t)];
    if (buffer.internal) r.fp32 = buffer.bytes >= logits.bytes && buffer.bytes < 2 * logits.bytes;
  }
  r.fp32 = r.fp32 && logits.contiguous != 0;
  return r;
}

bool exposed_internal(const Profile& profile, const TensorProfile& t) {
  if (!t.internal || t.producer < 0) return false;
  const std::string& kind = profile.nodes[static_cast<size_t>(t.producer)].kind;
  return t.copy_of >= 0 ? kind == "matmul" : kind == "dropout" || kind == "cross_entropy" || kind == "maxpool2d";
}

Profile Profile::at_batch(int64_t batch) const {
  if (batch < 1) throw ConfigError("micro-batch size must be at least 1");
  Profile p = *this;
  p.micro_batch_size = batch;
  for (TensorProfile& t : p.tensors) t.bytes = bytes_at(t.bytes_fit, batch);
  for (NodeProfile& n : p.nodes) {
    double recompute_ratio = n.fwd_ms > 0 ? n.recompute_ms / n.fwd_ms : 1.0;
    n.fwd_ms = ms_at(n.fwd_ms_fit, batch);
    n.bwd_ms = ms_at(n.bwd_ms_fit, batch);
    n.recompute_ms = n.fwd_ms * recompute_ratio;
    const double workspace_batch = n.workspace_full_at > 0 ? std::min<double>(batch, n.workspace_full_at) : batch;
    auto workspace = [&](const LinearFit& fit) {
      return static_cast<int64_t>(std::llround(std::max(0.0, fit.base + fit.per_sample * workspace_batch)));
    };
    n.fwd_workspace = workspace(n.fwd_workspace_fit);
    n.bwd_workspace = workspace(n.bwd_workspace_fit);
    if (n.bwd_input_workspace >= 0) n.bwd_input_workspace = workspace(n.bwd_input_workspace_fit);
  }
  p.measured_step_ms = 0;
  p.measured_fwd_bwd_ms = 0;
  p.measured_peak_bytes = 0;
  return p;
}

std::string Profile::device_mismatch(const std::string& run_device) const {
  if (source != ProfileSource::Measured || device.empty() || run_device.empty()) return "";  // unrecorded: older files
  auto type = [](const std::string& d) { return d.substr(0, d.find(':')); };
  if (type(device) == type(run_device)) return "";
  return "the profile was measured on " + device + ", the run is on " + run_device + " (profile on " +
         type(run_device) + ")";
}

}  // namespace dawnpiper
