// The op-graph executor: shapes, deterministic initialization, split == whole.
#include "torch_test.h"

#include <map>

#include "data/synthetic.h"
#include "exec/stage_module.h"
#include "models/model_config.h"

using namespace dawnpiper;

namespace {
at::Tensor run_whole(const OpGraph& g, uint64_t seed, int64_t step, TensorEnv* keep = nullptr) {
  StageModule m(g, 0, g.size(), seed);
  SyntheticData data(g, seed);
  TensorEnv env = m.make_env();
  data.load(env, g.data_inputs(0, g.size()), data.first_sample(step, 0, 1), m.device());
  m.forward(env, RunContext{step, step});
  if (keep) *keep = env;
  return env[g.nodes[g.loss_node()].outputs[0]];
}

// Gives `to` the weights of `from` by parameter name (graphs of other node ids draw other
// initial weights); returns `from`'s by name.
std::map<std::string, at::Tensor> copy_weights(StageModule& from, StageModule& to) {
  std::map<std::string, at::Tensor> weights;
  for (const StageParameter& p : from.parameters()) weights[p.name] = p.tensor;
  for (StageParameter& p : to.parameters()) p.tensor.detach().copy_(weights.at(p.name));
  return weights;
}
}  // namespace

TEST_CASE("forward produces the graph's shapes on every tiny preset", "[exec]") {
  for (const std::string& preset : preset_names()) {
    if (preset.find("-tiny") == std::string::npos) continue;
    INFO(preset);
    OpGraph g = build_model(preset_config(preset), 2);
    StageModule m(g, 0, g.size(), 7);
    CHECK(m.parameter_count() == g.parameter_count());
    SyntheticData data(g, 7);
    TensorEnv env = m.make_env();
    data.load(env, g.data_inputs(0, g.size()), 0, m.device());
    // Run node by node (no releasing) to check every output shape.
    for (int n = 0; n < g.size(); ++n) {
      m.run_node(n, env, RunContext{});
      const at::Tensor& out = env[g.nodes[n].outputs[0]];
      REQUIRE(out.defined());
      CHECK(out.sizes().vec() == g.tensor(g.nodes[n].outputs[0]).shape);
    }
    double loss = env[g.nodes[g.loss_node()].outputs[0]].item<double>();
    CHECK(std::isfinite(loss));
    CHECK(loss > 0);
  }
}

TEST_CASE("initialization is deterministic per (seed, node) and independent of the split", "[exec]") {
  OpGraph g = build_model(preset_config("gpt2-tiny"), 2);
  StageModule whole(g, 0, g.size(), 11);
  StageModule again(g, 0, g.size(), 11);
  StageModule other_seed(g, 0, g.size(), 12);
  const int cut = g.size() / 2;
  StageModule first(g, 0, cut, 11), second(g, cut, g.size(), 11);
  std::map<std::string, at::Tensor> by_name;
  for (const auto& p : whole.parameters()) by_name[p.name] = p.tensor;
  for (size_t i = 0; i < whole.parameters().size(); ++i)
    CHECK(at::equal(whole.parameters()[i].tensor, again.parameters()[i].tensor));
  CHECK_FALSE(at::equal(whole.parameters()[1].tensor, other_seed.parameters()[1].tensor));
  for (const StageModule* part : {&first, &second})
    for (const auto& p : part->parameters()) {
      INFO(p.name);
      REQUIRE(by_name.count(p.name));
      CHECK(at::equal(p.tensor, by_name[p.name]));
    }
  // The tied output projection lives in the second half: it holds a copy of the embedding.
  bool second_has_wte = false;
  for (const auto& p : second.parameters()) second_has_wte |= p.name == "wte.weight";
  CHECK(second_has_wte);
}

TEST_CASE("a graph split into two stages computes the whole graph's loss", "[exec]") {
  for (const char* preset : {"gpt2-tiny", "bert-tiny", "t5-tiny", "amoebanet-tiny"}) {
    INFO(preset);
    OpGraph g = build_model(preset_config(preset), 2);
    at::Tensor expected = run_whole(g, 5, 3);
    const int cut = g.size() / 2;
    StageModule first(g, 0, cut, 5), second(g, cut, g.size(), 5);
    SyntheticData data(g, 5);
    TensorEnv env = first.make_env();
    data.load(env, g.data_inputs(0, cut), data.first_sample(3, 0, 1), first.device());
    first.forward(env, RunContext{3, 3});
    // Only the crossing tensors travel: start the second stage from a fresh env.
    TensorEnv env2 = second.make_env();
    for (int t : first.outputs()) env2[t] = env[t].detach();
    data.load(env2, g.data_inputs(cut, g.size()), data.first_sample(3, 0, 1), second.device());
    second.forward(env2, RunContext{3, 3});
    at::Tensor loss = env2[g.nodes[g.loss_node()].outputs[0]];
    CHECK(loss.item<double>() == Approx(expected.item<double>()).epsilon(1e-6));
    // What the first stage outputs is exactly what crosses the cut.
    std::vector<int> crossing;
    for (const auto& c : g.crossing(cut)) crossing.push_back(c.tensor);
    CHECK(first.outputs() == crossing);
  }
}

TEST_CASE("dropout masks depend on (seed, node, step, micro-batch) only", "[exec]") {
  OpGraph g = build_model(preset_config("gpt2-tiny"), 2);
  double a = run_whole(g, 9, 4).item<double>();
  // Draws from the device's default generator in between change nothing: each mask has a
  // generator of its own (exec/device_random.h).
  at::Generator global = at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
  global.set_current_seed(12345);
  (void)at::rand({1000});
  double b = run_whole(g, 9, 4).item<double>();
  double c = run_whole(g, 9, 5).item<double>();
  CHECK(a == b);
  CHECK(a != c);
  // One dropout node alone, by micro-batch and step: the mask is its output's zeros.
  int drop = -1;
  for (const Node& n : g.nodes)
    if (n.kind == OpKind::Dropout) drop = n.id;
  REQUIRE(drop >= 0);
  StageModule m(g, drop, drop + 1, 9);
  auto zeros = [&](int64_t step, int64_t micro_batch) {
    TensorEnv env = m.make_env();
    const int in = g.nodes[static_cast<size_t>(drop)].inputs[0];
    env[static_cast<size_t>(in)] = at::ones(g.tensor(in).shape);
    m.run_node(drop, env, RunContext{step, micro_batch});
    return env[static_cast<size_t>(g.nodes[static_cast<size_t>(drop)].outputs[0])].eq(0);
  };
  const at::Tensor mask = zeros(3, 7);
  CHECK(mask.any().item<bool>());
  CHECK(at::equal(mask, zeros(3, 7)));
  CHECK(!at::equal(mask, zeros(3, 8)));
  CHECK(!at::equal(mask, zeros(4, 7)));
}

// --attention fused: each attention one aten::scaled_dot_product_attention call. With the same
// weights (copied by name: the graphs' node ids differ) and dropout 0 it computes the op-by-op
// attention's loss and gradients: gpt2 (causal), bert (padding mask), t5 (trained position bias,
// causal with a bias in the decoder, unscaled).
TEST_CASE("fused attention computes the op-by-op attention's loss and gradients", "[exec]") {
  at::set_num_threads(1);
  for (const char* preset : {"gpt2-tiny", "bert-tiny", "t5-tiny"}) {
    INFO(preset);
    ModelConfig c = preset_config(preset);
    set_dropout(c, 0);
    const OpGraph ops = build_model(c, 2);
    c.fused_attention = true;
    const OpGraph fused = build_model(c, 2);
    int calls = 0;
    for (const Node& n : fused.nodes) calls += n.kind == OpKind::Aten;
    CHECK(calls == c.layers + c.decoder_layers * 2);  // one per self- and cross-attention
    CHECK(fused.size() < ops.size());
    StageModule a(ops, 0, ops.size(), 3), b(fused, 0, fused.size(), 3);
    const std::map<std::string, at::Tensor> weights = copy_weights(a, b);
    auto loss_of = [](const OpGraph& g, StageModule& m) {
      SyntheticData data(g, 3);
      TensorEnv env = m.make_env();
      data.load(env, g.data_inputs(0, g.size()), 0, m.device());
      m.forward(env, RunContext{});
      at::Tensor loss = env[g.nodes[g.loss_node()].outputs[0]];
      env.clear();
      loss.backward();
      return loss.item<double>();
    };
    CHECK(loss_of(fused, b) == Approx(loss_of(ops, a)).epsilon(1e-5));
    for (const StageParameter& p : b.parameters()) {
      INFO(p.name);
      const at::Tensor want = weights.at(p.name).grad();
      REQUIRE(want.defined());
      // relative, with a floor for gradients that are zero but for rounding (key biases)
      const double scale = want.abs().max().item<double>();
      CHECK((p.tensor.grad() - want).abs().max().item<double>() <= 1e-4 * scale + 1e-8);
    }
  }
  // Evaluation runs the call without its dropout: the dropout-0 model's loss, at any step.
  ModelConfig c = preset_config("gpt2-tiny");  // dropout 0.1
  c.fused_attention = true;
  const OpGraph with_dropout = build_model(c, 2);
  set_dropout(c, 0);
  const OpGraph without = build_model(c, 2);
  StageModule a(with_dropout, 0, with_dropout.size(), 3), b(without, 0, without.size(), 3);
  copy_weights(a, b);
  auto eval_loss = [](const OpGraph& g, const StageModule& m, int64_t step) {
    SyntheticData data(g, 3);
    TensorEnv env = m.make_env();
    data.load(env, g.data_inputs(0, g.size()), 0, m.device());
    RunContext ctx{step, 0};
    ctx.eval = true;
    m.forward(env, ctx);
    return env[g.nodes[g.loss_node()].outputs[0]].item<double>();
  };
  CHECK(eval_loss(with_dropout, a, 1) == eval_loss(with_dropout, a, 2));
  CHECK(eval_loss(with_dropout, a, 1) == Approx(eval_loss(without, b, 1)).epsilon(1e-6));
  ModelConfig mlp = preset_config("mlp-tiny");
  mlp.fused_attention = true;
  CHECK_THROWS_WITH(check_config(mlp), Catch::Contains("transformer"));
  CHECK_THROWS_WITH(from_name<AttentionKind>("flash"),
                    Catch::Contains("unknown attention 'flash' (choose ops or fused)"));
}
