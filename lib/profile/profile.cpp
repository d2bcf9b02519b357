#include "profile/profile.h"

#include <cmath>

#include "util/error.h"

namespace dawnpiper {

namespace {
int64_t bytes_at(const LinearFit& fit, int64_t batch) {
  return static_cast<int64_t>(std::llround(std::max(0.0, fit.at(batch))));
}
double ms_at(const LinearFit& fit, int64_t batch) { return std::max(0.0, fit.at(batch)); }
}  // namespace

namespace {
// "aten::transpose.int" -> "aten::transpose"
std::string op_of(const std::string& kind) {
  return kind.substr(0, kind.find('.', kind.find("::") == std::string::npos ? 0 : kind.find("::")));
}
}  // namespace

bool is_permute_kind(const std::string& kind) {
  const std::string op = op_of(kind);
  return kind == "transpose" || op == "aten::transpose" || op == "aten::permute" || op == "aten::t" ||
         op == "aten::swapaxes" || op == "aten::movedim";
}

bool is_reshape_kind(const std::string& kind) {
  const std::string op = op_of(kind);
  return kind == "reshape" || op == "aten::reshape" || op == "aten::view" || op == "aten::_unsafe_view" ||
         op == "aten::flatten";
}

bool view_allocates_gradient(const std::string& kind) {
  const std::string op = op_of(kind);
  return op == "aten::slice" || op == "aten::select" || op == "aten::narrow" || op == "aten::expand" ||
         op == "aten::split" || op == "aten::split_with_sizes" || op == "aten::unbind" || op == "aten::chunk" ||
         op == "aten::as_strided" || op == "aten::diagonal" || op == "aten::unfold";
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
    n.fwd_workspace = bytes_at(n.fwd_workspace_fit, batch);
    n.bwd_workspace = bytes_at(n.bwd_workspace_fit, batch);
  }
  p.measured_step_ms = 0;
  p.measured_fwd_bwd_ms = 0;
  p.measured_peak_bytes = 0;
  return p;
}

int64_t Profile::total_param_bytes() const {
  int64_t b = 0;
  for (const NodeProfile& n : nodes) b += n.param_bytes;
  return b;
}

}  // namespace dawnpiper
