#include "data/synthetic.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace dawnpiper {

SyntheticData::SyntheticData(const OpGraph& graph, uint64_t seed) : graph_(&graph), seed_(seed) {
  for (const Node& n : graph.nodes)
    if (n.kind == OpKind::Embedding && !n.params.empty()) {
      vocab_ = n.params[0].shape[0];
      break;
    }
  classes_ = graph.tensor(graph.nodes[graph.loss_node()].inputs[0]).shape.back();
}

void SyntheticData::load(TensorEnv& env, const std::vector<int>& wanted, int64_t first_sample,
                         at::Device device) const {
  at::NoGradGuard no_grad;
  for (int t : wanted) {
    const TensorInfo& info = graph_->tensor(t);
    env.at(t) = make(info.name, info.shape, first_sample).to(device);
  }
}

at::Tensor SyntheticData::make(const std::string& name, const Shape& shape,
                               int64_t first_sample) const {
  const int64_t B = shape.at(0);
  const std::string& family = graph_->model;
  if (name == "attn_mask") return at::zeros(shape, at::kFloat);
  std::vector<at::Tensor> samples;
  for (int64_t b = 0; b < B; ++b) {
    const uint64_t sample_seed = mix_seed(seed_ ^ 0xda7aULL, first_sample + b);
    at::Generator gen = at::detail::createCPUGenerator(sample_seed);
    if (family == "gpt2" || family == "bert" || family == "t5") {
      const int64_t V = vocab_, S = shape.at(1);
      // bert sees labels only at the masked 15%: counting sequences (x + 1) make the masked token
      // inferable from its position and neighbours quickly enough to show learning in 20 steps.
      const int64_t a = family == "bert" ? 1 : 5, c = family == "bert" ? 1 : 3;
      std::vector<int64_t> seq(S + 1);
      // Log-uniform (Zipf-like) start token: skewed like text, so even the token frequencies
      // at each position are learnable, not only the transition rule.
      const double u = at::rand({1}, gen).item<double>();
      seq[0] = std::min<int64_t>(V - 1, static_cast<int64_t>(std::pow(static_cast<double>(V), u)) - 1);
      for (int64_t i = 1; i <= S; ++i) seq[i] = (a * seq[i - 1] + c) % V;
      std::vector<int64_t> out(S);
      if (family == "gpt2") {
        for (int64_t i = 0; i < S; ++i) out[i] = name == "labels" ? seq[i + 1] : seq[i];
      } else if (family == "bert") {
        at::Tensor masked = at::rand({S}, gen) < 0.15;
        auto m = masked.accessor<bool, 1>();
        for (int64_t i = 0; i < S; ++i) {
          if (name == "labels") out[i] = m[i] ? seq[i] : -100;
          else out[i] = m[i] ? 0 : seq[i];
        }
      } else {  // t5 copy task
        for (int64_t i = 0; i < S; ++i) out[i] = name == "dec_tokens" ? (i ? seq[i - 1] : 0) : seq[i];
      }
      samples.push_back(at::tensor(out, at::kLong));
      continue;
    }
    // amoebanet / mlp: class prototypes from the seed alone.
    const int64_t classes = classes_;
    const int64_t label = at::randint(classes, {1}, gen, at::kLong).item<int64_t>();
    if (name == "labels") {
      samples.push_back(at::full({}, label, at::kLong));
      continue;
    }
    Shape one(shape.begin() + 1, shape.end());
    at::Generator proto_gen = at::detail::createCPUGenerator(mix_seed(seed_ ^ 0x9e07ULL, label));
    at::Tensor prototype = at::randn(one, proto_gen, at::kFloat);
    samples.push_back(prototype + 0.5 * at::randn(one, gen, at::kFloat));
  }
  return at::stack(samples);
}

}  // namespace dawnpiper
