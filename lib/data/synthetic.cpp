#include "data/synthetic.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "data/scalar_type.h"
#include "util/error.h"
#include "util/seed.h"

namespace dawnpiper {

bool is_token_role(const std::string& role) {
  return role == "tokens" || role == "tokens_next" || role == "dec_tokens" || role == "mlm_tokens" ||
         role == "mlm_labels";
}

at::Tensor token_input(const Node& input, const std::vector<int64_t>& seq, int64_t S, at::Generator& gen) {
  const std::string& role = input.role;
  std::vector<int64_t> out(static_cast<size_t>(S));
  if (role == "tokens" || role == "tokens_next") {
    const int64_t shift = role == "tokens_next" ? 1 : 0;
    for (int64_t i = 0; i < S; ++i) out[i] = seq[static_cast<size_t>(i + shift)];
  } else if (role == "dec_tokens") {
    for (int64_t i = 0; i < S; ++i) out[i] = i ? seq[static_cast<size_t>(i - 1)] : 0;
  } else if (role == "mlm_tokens" || role == "mlm_labels") {
    const int64_t mask_token = input.attr_int("mask_token", 0);
    at::Tensor masked = at::rand({S}, gen) < 0.15;
    auto m = masked.accessor<bool, 1>();
    for (int64_t i = 0; i < S; ++i) {
      if (role == "mlm_labels")
        out[i] = m[i] ? seq[static_cast<size_t>(i)] : -100;
      else
        out[i] = m[i] ? mask_token : seq[static_cast<size_t>(i)];
    }
  } else {
    throw ConfigError("input " + input.name + " (role '" + role + "') is not made of tokens");
  }
  return at::tensor(out, at::kLong);
}

SyntheticData::SyntheticData(const OpGraph& graph, uint64_t seed) : DataSource(graph), seed_(seed) {
  for (const Node& n : graph.nodes)
    if (n.kind == OpKind::Embedding && !n.params.empty()) {
      vocab_ = n.params[0].shape[0];
      break;
    }
  const Node& loss = graph.nodes[graph.loss_node()];
  if (loss.kind == OpKind::CrossEntropy) classes_ = graph.tensor(loss.inputs[0]).shape.back();
  if (loss.kind == OpKind::LinearCrossEntropy) classes_ = loss.params[0].shape[0];
}

void SyntheticData::load(TensorEnv& env, const std::vector<int>& wanted, int64_t first_sample,
                         at::Device device) const {
  at::NoGradGuard no_grad;
  for (int t : wanted) {
    const TensorInfo& info = graph_->tensor(t);
    env.at(t) = make(graph_->nodes[info.producer], info.shape, first_sample).to(device, scalar_type(info.dtype));
  }
}

at::Tensor SyntheticData::make(const Node& input, const Shape& shape, int64_t first_sample) const {
  const int64_t B = shape.at(0);
  const std::string& role = input.role;
  if (role == "zeros") return at::zeros(shape, at::kFloat);
  std::vector<at::Tensor> samples;
  const Shape one(shape.begin() + 1, shape.end());
  for (int64_t b = 0; b < B; ++b) {
    const uint64_t sample_seed = mix_seed(seed_ ^ 0xda7aULL, first_sample + b);
    at::Generator gen = at::detail::createCPUGenerator(sample_seed);
    if (is_token_role(role)) {
      const int64_t V = input.attr_int("vocab", vocab_), S = shape.at(1);
      const bool mlm = role == "mlm_tokens" || role == "mlm_labels";
      const int64_t a = mlm ? 1 : 5, c = mlm ? 1 : 3;
      std::vector<int64_t> seq(static_cast<size_t>(S + 1));
      // Log-uniform (Zipf-like) start token: skewed like text, so even the token frequencies
      // at each position are learnable, not only the transition rule.
      const double u = at::rand({1}, gen).item<double>();
      seq[0] = std::min<int64_t>(V - 1, static_cast<int64_t>(std::pow(static_cast<double>(V), u)) - 1);
      for (int64_t i = 1; i <= S; ++i) seq[i] = (a * seq[i - 1] + c) % V;
      samples.push_back(token_input(input, seq, S, gen));
      continue;
    }
    if (role == "randn") {
      samples.push_back(at::randn(one, gen, at::kFloat));
      continue;
    }
    if (role == "randint") {
      samples.push_back(at::randint(input.attr_int("high", 2), one, gen, at::kLong));
      continue;
    }
    if (role != "prototype" && role != "class")
      throw ConfigError("input " + input.name + " has role '" + role + "', which the synthetic data cannot fill");
    // Class prototypes from the seed alone.
    const int64_t classes = input.attr_int("high", classes_);
    const int64_t label = at::randint(classes, {1}, gen, at::kLong).item<int64_t>();
    if (role == "class") {
      samples.push_back(at::full({}, label, at::kLong));
      continue;
    }
    at::Generator proto_gen = at::detail::createCPUGenerator(mix_seed(seed_ ^ 0x9e07ULL, label));
    at::Tensor prototype = at::randn(one, proto_gen, at::kFloat);
    samples.push_back(prototype + 0.5 * at::randn(one, gen, at::kFloat));
  }
  return at::stack(samples);
}

}  // namespace dawnpiper
