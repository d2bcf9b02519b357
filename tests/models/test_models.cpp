// The model zoo: graph invariants for every preset, published parameter counts, shapes,
// overrides and bad input.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "models/model_config.h"
#include "util/error.h"

using namespace dawnpiper;

TEST_CASE("every preset builds a valid, acyclic, connected graph", "[models]") {
  for (const std::string& preset : preset_names()) {
    ModelConfig c = preset_config(preset);
    if (c.layers > 6) continue;  // paper sizes are checked below (slower)
    INFO(preset);
    OpGraph g = build_model(c, 2);
    REQUIRE_NOTHROW(g.validate());
    // Acyclic in execution order: every input is produced earlier.
    for (const Node& n : g.nodes)
      for (int t : n.inputs) CHECK(g.tensor(t).producer < n.id);
    // Every node reaches the loss (no dead branches): walk backwards from the loss.
    std::vector<bool> live(g.size(), false);
    live[g.loss_node()] = true;
    for (int i = g.size() - 1; i >= 0; --i)
      if (live[i])
        for (int t : g.nodes[i].inputs) live[g.tensor(t).producer] = true;
    for (int i = 0; i < g.size(); ++i) CHECK(live[i]);
    // Data inputs never appear in crossing sets.
    for (int cut = 1; cut < g.size(); cut += 7)
      for (const auto& c2 : g.crossing(cut)) CHECK_FALSE(g.is_data(c2.tensor));
  }
}

TEST_CASE("paper presets have the published parameter counts (within 3%)", "[models]") {
  struct Expect {
    const char* preset;
    double published;
  };
  // bert-large 340M, gpt2-large 774M (the paper rounds to 770M), t5-large 780M as the paper
  // states (v1.0 dimensions with an untied head), AmoebaNet-D 28M.
  for (Expect e : {Expect{"bert-large", 340e6}, Expect{"gpt2-large", 770e6}, Expect{"t5-large", 780e6},
                   Expect{"amoebanet-d", 28e6}}) {
    INFO(e.preset);
    OpGraph g = build_model(preset_config(e.preset), 1);
    double ratio = static_cast<double>(g.parameter_count()) / e.published;
    CHECK(ratio > 0.97);
    CHECK(ratio < 1.03);
  }
  CHECK(build_model(preset_config("bert-large"), 1).size() > 1000);
}

TEST_CASE("output shapes follow the configuration", "[models]") {
  OpGraph gpt = build_model(preset_config("gpt2-tiny"), 3);
  const Node& loss = gpt.nodes[gpt.loss_node()];
  CHECK(gpt.tensor(loss.inputs[0]).shape == Shape{3, 32, 512});  // logits [B, S, V]
  CHECK(gpt.tensor(loss.outputs[0]).shape.empty());              // scalar loss
  OpGraph amoeba = build_model(preset_config("amoebanet-tiny"), 2);
  CHECK(amoeba.tensor(amoeba.nodes[amoeba.loss_node()].inputs[0]).shape == Shape{2, 10});
  OpGraph t5 = build_model(preset_config("t5-tiny"), 2);
  CHECK(t5.tensor(t5.nodes[t5.loss_node()].inputs[0]).shape == Shape{2, 32, 512});
  // Batch size scales activations linearly, parameters not at all.
  OpGraph gpt6 = build_model(preset_config("gpt2-tiny"), 6);
  CHECK(gpt6.parameter_count() == gpt.parameter_count());
  CHECK(gpt6.tensor(gpt6.nodes[20].outputs[0]).bytes() == 2 * gpt.tensor(gpt.nodes[20].outputs[0]).bytes());
}

TEST_CASE("overrides change the graph and bad ones are rejected", "[models]") {
  ModelConfig c = preset_config("gpt2-tiny");
  set_integer_override(c, "layers", 3);
  set_integer_override(c, "hidden", 96);
  set_integer_override(c, "heads", 6);
  OpGraph g = build_model(c, 1);
  CHECK(g.blocks.size() == 5);  // embed, 3 layers, head
  set_integer_override(c, "heads", 5);
  CHECK_THROWS_AS(check_config(c), ConfigError);
  CHECK_THROWS_AS(preset_config("gpt3-huge"), ConfigError);
  CHECK_THROWS_WITH(set_integer_override(c, "layers", 0), Catch::Contains("--layers 0 must be a positive integer"));
  CHECK_THROWS_AS(set_integer_override(c, "colour", 3), ConfigError);
  CHECK_THROWS_AS(set_dropout(c, 1.0), ConfigError);
  ModelConfig a = preset_config("amoebanet-tiny");
  set_integer_override(a, "image-size", 48);
  CHECK_THROWS_AS(check_config(a), ConfigError);
  CHECK_THROWS_AS(build_model(preset_config("mlp-tiny"), 0), ConfigError);
}

TEST_CASE("a chunked output projection has the whole projection's parameters and output", "[models]") {
  for (const char* preset : {"gpt2-tiny", "bert-tiny", "t5-tiny"}) {
    INFO(preset);
    ModelConfig c = preset_config(preset);
    const OpGraph whole = build_model(c, 2);
    set_integer_override(c, "output-chunks", 3);
    const OpGraph chunked = build_model(c, 2);
    // Three linears and a concat where one linear was.
    CHECK(chunked.size() == whole.size() + 3);
    CHECK(chunked.parameter_count() == whole.parameter_count());
    CHECK(chunked.fingerprint() != whole.fingerprint());
    const Node& concat = chunked.nodes[chunked.tensor(chunked.nodes[chunked.loss_node()].inputs[0]).producer];
    REQUIRE(concat.kind == OpKind::Concat);
    CHECK(chunked.tensor(concat.outputs[0]).shape == whole.tensor(whole.nodes[whole.loss_node()].inputs[0]).shape);
    int64_t vocab = 0;
    for (int t : concat.inputs) {
      const Node& part = chunked.nodes[chunked.tensor(t).producer];
      CHECK(part.kind == OpKind::Linear);
      const int64_t rows = chunked.tensor(t).shape.back();
      CHECK((rows == c.vocab / 3 || rows == c.vocab / 3 + 1));
      if (part.params[0].tied()) {  // rows [vocab, vocab + rows) of the embedding
        CHECK(part.attr_ints("rows") == std::vector<int64_t>{vocab, vocab + rows});
      } else {
        CHECK(part.params[0].shape[0] == rows);
      }
      vocab += rows;
    }
    CHECK(vocab == c.vocab);
  }
  // One chunk is the graph the preset always had (profiles and plans made for it still match).
  ModelConfig one = preset_config("gpt2-tiny");
  set_integer_override(one, "output-chunks", 1);
  CHECK(build_model(one, 2).fingerprint() == build_model(preset_config("gpt2-tiny"), 2).fingerprint());
  ModelConfig too_many = preset_config("gpt2-tiny");
  set_integer_override(too_many, "output-chunks", 513);
  CHECK_THROWS_AS(check_config(too_many), ConfigError);
  ModelConfig classifier = preset_config("mlp-tiny");
  set_integer_override(classifier, "output-chunks", 2);
  CHECK_THROWS_WITH(check_config(classifier), Catch::Contains("language model"));
}

TEST_CASE("a fused LM loss is one node with the head's parameters, names and labels", "[models]") {
  for (const char* preset : {"gpt2-tiny", "bert-tiny", "t5-tiny"}) {
    INFO(preset);
    ModelConfig c = preset_config(preset);
    const OpGraph whole = build_model(c, 2);
    set_integer_override(c, "loss-chunk-tokens", 24);
    const OpGraph fused = build_model(c, 2);
    CHECK(fused.size() == whole.size() - 1);  // the projection and the loss are one node
    CHECK(fused.parameter_count() == whole.parameter_count());
    CHECK(fused.fingerprint() != whole.fingerprint());
    const Node& loss = fused.nodes[fused.loss_node()];
    REQUIRE(loss.kind == OpKind::LinearCrossEntropy);
    CHECK(loss.attr_int("chunk_tokens", 0) == 24);
    CHECK(fused.tensor(loss.outputs[0]).shape.empty());
    // It reads the head's input and the labels, and owns (or ties) the head's parameters.
    const Node& head = whole.nodes[whole.tensor(whole.nodes[whole.loss_node()].inputs[0]).producer];
    CHECK(loss.name == head.name);
    CHECK(fused.tensor(loss.inputs[0]).shape == whole.tensor(head.inputs[0]).shape);
    CHECK(fused.nodes[fused.tensor(loss.inputs[1]).producer].role ==
          whole.nodes[whole.tensor(whole.nodes[whole.loss_node()].inputs[1]).producer].role);
    REQUIRE(loss.params.size() == head.params.size());
    for (size_t i = 0; i < head.params.size(); ++i) {
      CHECK(loss.params[i].name == head.params[i].name);
      CHECK(loss.params[i].shape == head.params[i].shape);
      CHECK(loss.params[i].tied_node == head.params[i].tied_node);
    }
  }
  ModelConfig both = preset_config("gpt2-tiny");
  set_integer_override(both, "loss-chunk-tokens", 24);
  set_integer_override(both, "output-chunks", 2);
  CHECK_THROWS_WITH(check_config(both), Catch::Contains("exclude each other"));
  ModelConfig classifier = preset_config("amoebanet-tiny");
  set_integer_override(classifier, "loss-chunk-tokens", 24);
  CHECK_THROWS_WITH(check_config(classifier), Catch::Contains("language model"));
  ModelConfig zero = preset_config("gpt2-tiny");
  CHECK_THROWS_AS(set_integer_override(zero, "loss-chunk-tokens", 0), ConfigError);
}

TEST_CASE("t5 decoder layers read the encoder output: long edges cross every decoder cut", "[models]") {
  OpGraph g = build_model(preset_config("t5-tiny"), 1);
  int enc_out = -1;
  for (const Node& n : g.nodes)
    if (n.name == "encoder.final_drop" || (n.name == "encoder.final_ln" && enc_out < 0)) enc_out = n.outputs[0];
  REQUIRE(enc_out >= 0);
  const auto& consumers = g.tensor(enc_out).consumers;
  CHECK(consumers.size() >= 2 * 2);  // k and v of every decoder layer's cross attention
}
