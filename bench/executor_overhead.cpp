// Benchmark: one training step (forward + backward) of a GPT-2 or MLP preset through the op-graph
// executor, against the same model written as a plain LibTorch module (direct ATen calls, same
// parameters, same data, dropout off so both compute the same loss).
//   usage: dp_bench_executor [preset=gpt2-tiny] [micro-batch=8] [iterations=50]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "data/synthetic.h"
#include "exec/stage_module.h"
#include "models/model_config.h"

using namespace dawnpiper;

namespace {

using Params = std::map<std::string, at::Tensor>;

at::Tensor plain_gpt2(const Params& p, const ModelConfig& c, const at::Tensor& tokens, const at::Tensor& labels) {
  const int64_t B = tokens.size(0), S = tokens.size(1), H = c.hidden, nh = c.heads, d = H / nh;
  at::Tensor x = at::embedding(p.at("wte.weight"), tokens) + p.at("wpe.weight").narrow(0, 0, S);
  at::Tensor causal = at::ones({S, S}, at::kBool).triu(1);
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string q = "layer" + std::to_string(l) + ".";
    auto w = [&](const std::string& n) { return p.at(q + n); };
    at::Tensor h = at::layer_norm(x, {H}, w("ln1.weight"), w("ln1.bias"));
    auto heads = [&](const std::string& n) {
      return at::linear(h, w("attn." + n + ".weight"), w("attn." + n + ".bias"))
          .reshape({B, S, nh, d})
          .permute({0, 2, 1, 3});
    };
    at::Tensor s = at::matmul(heads("q"), heads("k").permute({0, 1, 3, 2})) * (1.0 / std::sqrt(double(d)));
    s = s.masked_fill(causal, -INFINITY);
    at::Tensor ctx = at::matmul(at::softmax(s, -1), heads("v")).permute({0, 2, 1, 3}).reshape({B, S, H});
    x = x + at::linear(ctx, w("attn.out.weight"), w("attn.out.bias"));
    h = at::layer_norm(x, {H}, w("ln2.weight"), w("ln2.bias"));
    h = at::gelu(at::linear(h, w("mlp.fc.weight"), w("mlp.fc.bias")));
    x = x + at::linear(h, w("mlp.proj.weight"), w("mlp.proj.bias"));
  }
  x = at::layer_norm(x, {H}, p.at("ln_f.weight"), p.at("ln_f.bias"));
  at::Tensor logits = at::linear(x, p.at("wte.weight"));
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), labels.reshape({-1}));
}

at::Tensor plain_mlp(const Params& p, const ModelConfig& c, const at::Tensor& x0, const at::Tensor& labels) {
  at::Tensor x = x0;
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string q = "layer" + std::to_string(l) + ".fc.";
    x = at::relu(at::linear(x, p.at(q + "weight"), p.at(q + "bias")));
  }
  return at::cross_entropy_loss(at::linear(x, p.at("head.fc.weight"), p.at("head.fc.bias")), labels);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const std::string preset = argc > 1 ? argv[1] : "gpt2-tiny";
  const int64_t batch = argc > 2 ? std::stoll(argv[2]) : 8;
  const int iterations = argc > 3 ? std::stoi(argv[3]) : 50;
  at::set_num_threads(1);
  ModelConfig config = preset_config(preset);
  config.dropout = 0;
  OpGraph g = build_model(config, batch);
  StageModule module(g, 0, g.size(), 1);
  Params params;
  for (const auto& p : module.parameters()) params[p.name] = p.tensor;
  SyntheticData data(g, 1);
  TensorEnv inputs = module.make_env();
  data.load(inputs, g.data_inputs(0, g.size()), 0, module.device());
  const int loss_id = g.nodes[g.loss_node()].outputs[0];
  auto input = [&](const char* name) {
    for (const Node& n : g.nodes)
      if (n.kind == OpKind::Input && n.name == name) return inputs[n.outputs[0]];
    throw std::runtime_error(name);
  };

  auto graph_step = [&] {
    TensorEnv env = inputs;
    module.forward(env, RunContext{});
    at::Tensor loss = env[loss_id];
    loss.backward();
    return loss.item<double>();
  };
  auto plain_step = [&] {
    at::Tensor loss = config.family == ModelFamily::Gpt2
                          ? plain_gpt2(params, config, input("tokens"), input("labels"))
                          : plain_mlp(params, config, input("features"), input("labels"));
    loss.backward();
    return loss.item<double>();
  };
  const double graph_loss = graph_step(), plain_loss = plain_step();
  std::vector<double> tg, tp;
  for (int i = 0; i < iterations; ++i) {  // interleaved, so drift affects both alike
    for (int which = 0; which < 2; ++which) {
      auto t0 = std::chrono::steady_clock::now();
      which == 0 ? graph_step() : plain_step();
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      (which == 0 ? tg : tp).push_back(ms);
    }
  }
  std::printf("%s micro-batch %lld, %d iterations, 1 thread\n", preset.c_str(), (long long)batch, iterations);
  std::printf("  loss: graph %.9g plain %.9g\n", graph_loss, plain_loss);
  std::printf("  median step: graph executor %.3f ms, plain LibTorch %.3f ms, overhead %+.1f%%\n", median(tg),
              median(tp), 100.0 * (median(tg) / median(tp) - 1));
  return 0;
}
