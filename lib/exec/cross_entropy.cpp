#include "exec/cross_entropy.h"

#include <algorithm>
#include <stdexcept>

#include <torch/csrc/autograd/custom_function.h>

#include "graph/op_graph.h"

namespace dawnpiper {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kIgnored = kIgnoredLabel;

// Calls f(first, count) for consecutive row ranges of at most `chunk` rows.
template <class F>
void for_chunks(int64_t rows, int64_t chunk, F&& f) {
  for (int64_t first = 0; first < rows; first += chunk) f(first, std::min(chunk, rows - first));
}

// One chunk's logits in fp32 (a bf16 projection is widened, as the zoo's loss does). An empty
// bias stands for none: autograd functions take no undefined tensors.
at::Tensor chunk_logits(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias) {
  at::Tensor logits = bias.numel() > 0 ? at::linear(hidden, weight, bias) : at::linear(hidden, weight);
  return logits.scalar_type() == at::kFloat ? logits : logits.to(at::kFloat);
}

// Turns fp32 probabilities g [rows, C] into the gradient of the mean loss over its rows, in
// place: softmax - one_hot(label), times d loss / d (one position's loss); zero on unlabelled
// positions. `count`: the labelled positions (a gradient of zero where there are none, not
// 0 * inf).
void probabilities_to_gradient(at::Tensor& g, const at::Tensor& labels, const at::Tensor& grad_loss,
                               const at::Tensor& count) {
  const at::Tensor scale = grad_loss.to(at::kFloat) / count.clamp_min(1);
  g.scatter_add_(1, labels.clamp_min(0).unsqueeze(1), at::full({g.size(0), 1}, -1.0, g.options()));
  g.mul_((labels.ne(kIgnored).to(at::kFloat) * scale).unsqueeze(1));
}

// The zoo's loss over given logits. Forward: fp32 log-probabilities, written over the logits
// where the caller holds the only handle on them (so no mark_dirty: nobody sees the change; the
// caller checks that, exec/stage_module.cpp), else over an fp32 copy of bf16 logits, else a new
// buffer by ATen's kernel; then nll_loss. Backward writes the logits' gradient over the saved
// log-probabilities: nothing else reads them, and a stage's graph runs backward once (a second
// backward fails autograd's version check; no double backward).
struct CrossEntropyFunction : torch::autograd::Function<CrossEntropyFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& labels,
                            bool overwrite_logits, at::Tensor* exposed) {
    const at::Tensor rows = logits.reshape({-1, logits.size(-1)});
    at::Tensor log_probs;
    if (rows.scalar_type() == at::kFloat && !overwrite_logits) {
      log_probs = at::log_softmax(rows, 1);
    } else {
      // In place, a chunk of rows at a time: one chunk's log-softmax is the only new buffer.
      log_probs = rows.scalar_type() == at::kFloat ? rows.detach() : rows.to(at::kFloat);
      for_chunks(log_probs.size(0), cross_entropy_chunk_rows(log_probs.size(0)), [&](int64_t first, int64_t n) {
        at::Tensor chunk = log_probs.narrow(0, first, n);
        chunk.copy_(at::log_softmax(chunk, 1));
      });
    }
    const at::Tensor y = labels.reshape({-1});
    ctx->save_for_backward({log_probs, y});
    if (exposed) *exposed = log_probs;
    ctx->saved_data["sizes"] = logits.sizes();
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return at::nll_loss(log_probs, y, {}, at::Reduction::Mean, kIgnored);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    at::Tensor g = saved[0].exp_();
    const at::Tensor& y = saved[1];
    probabilities_to_gradient(g, y, grad_outputs[0], y.ne(kIgnored).sum().to(at::kFloat));
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {g.view(ctx->saved_data["sizes"].toIntVector()).to(dtype), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct LinearCrossEntropyFunction : torch::autograd::Function<LinearCrossEntropyFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& labels, int64_t chunk) {
    const at::Tensor h = hidden.reshape({-1, hidden.size(-1)});
    const at::Tensor y = labels.reshape({-1});
    const at::Tensor w = weight.to(h.scalar_type()), b = bias.to(h.scalar_type());  // bf16: a copy for the call
    at::Tensor lse = at::empty({h.size(0)}, hidden.options().dtype(at::kFloat));
    at::Tensor total = at::zeros({}, lse.options());
    for_chunks(h.size(0), chunk, [&](int64_t first, int64_t n) {
      const at::Tensor logits = chunk_logits(h.narrow(0, first, n), w, b);
      at::Tensor chunk_lse = lse.narrow(0, first, n);
      at::logsumexp_out(chunk_lse, logits, {1});
      const at::Tensor labels_here = y.narrow(0, first, n);
      const at::Tensor target = logits.gather(1, labels_here.clamp_min(0).unsqueeze(1)).squeeze(1);
      total.add_(((chunk_lse - target) * labels_here.ne(kIgnored)).sum());
    });
    at::Tensor count = y.ne(kIgnored).sum().to(at::kFloat);
    ctx->save_for_backward({hidden, weight, bias, labels, lse, count});
    ctx->saved_data["chunk"] = chunk;
    return total.div_(count);
  }

  // The weight's and bias's gradients are summed over the chunks in their own dtype (fp32
  // master weights: one rounding, as one projection's backward has), the hidden states' in
  // theirs. Only those asked for: a split backward's I wants the hidden states' alone, its W
  // the weight's and bias's (runtime/pipeline_stage.h).
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &weight = saved[1], &bias = saved[2], &labels = saved[3], &lse = saved[4];
    const at::Tensor h = hidden.reshape({-1, hidden.size(-1)});
    const at::Tensor y = labels.reshape({-1});
    const at::Tensor w = weight.to(h.scalar_type()), b = bias.to(h.scalar_type());
    const bool want_h = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    at::Tensor grad_h = want_h ? at::empty_like(h) : at::Tensor();
    at::Tensor grad_w = want_w ? at::zeros_like(weight) : at::Tensor();
    at::Tensor grad_b = bias.numel() > 0 && ctx->needs_input_grad(2) ? at::zeros_like(bias) : at::Tensor();
    for_chunks(h.size(0), ctx->saved_data["chunk"].toInt(), [&](int64_t first, int64_t n) {
      const at::Tensor rows = h.narrow(0, first, n);
      at::Tensor g = chunk_logits(rows, w, b);
      g.sub_(lse.narrow(0, first, n).unsqueeze(1)).exp_();
      probabilities_to_gradient(g, y.narrow(0, first, n), grad_outputs[0], saved[5]);
      if (want_h) {
        at::Tensor grad_rows = grad_h.narrow(0, first, n);
        at::mm_out(grad_rows, g.to(h.scalar_type()), w);  // g is fp32; to() copies only for bf16
      }
      if (want_w) grad_w.addmm_(g.t().to(grad_w.scalar_type()), rows.to(grad_w.scalar_type()));
      if (grad_b.defined()) grad_b.add_(g.sum(0).to(grad_b.scalar_type()));
    });
    return {want_h ? grad_h.view(hidden.sizes()) : at::Tensor(), grad_w, grad_b, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& labels, bool overwrite_logits,
                         at::Tensor* log_probs) {
  return CrossEntropyFunction::apply(logits, labels, overwrite_logits, log_probs);
}

at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias,
                                const at::Tensor& labels, int64_t chunk_tokens) {
  if (chunk_tokens < 1) throw std::invalid_argument("linear_cross_entropy: chunk_tokens must be positive");
  return LinearCrossEntropyFunction::apply(hidden, weight, bias.defined() ? bias : at::empty({0}, weight.options()),
                                           labels, chunk_tokens);
}

}  // namespace dawnpiper
