// Imported models (scripts/export_model.py -> models/model_file.h -> Aten nodes run through the
// c10 dispatcher) against PyTorch eager: the same loss and every parameter's gradient.
#include "import/import_test.h"

#include <set>

#include "exec/stage_module.h"
#include "models/model_file.h"
#include "profile/analytic.h"
#include "profile/profiler.h"
#include "quick_profile.h"

#include <map>

using namespace dawnpiper;
using namespace dawnpiper::test;

namespace {

// Loss and gradients of the whole imported graph on the reference's example batch, within
// `tolerance` (relative).
void check_against_eager(const std::string& name, double tolerance = 1e-5) {
  INFO(name);
  const auto file = read_model_file(test_model(name));
  SafetensorsFile ref(test_models_dir() + "/" + name + ".ref");
  const at::Tensor first_input = read_tensor(ref, "input." + file->graph.at("inputs")[0].at("name").get<std::string>());
  const OpGraph g = build_imported(*file, first_input.size(0));
  // Hugging Face's heads call aten::cross_entropy_loss with its defaults: the importer makes it
  // the zoo's loss (docs/model-format.md, "The loss over the logits"), whose forward here writes
  // over the logits (nothing else holds them) and whose backward over their log-probabilities
  // (a --loss-chunk-tokens export has the fused loss instead).
  const OpKind loss_kind = g.nodes[static_cast<size_t>(g.loss_node())].kind;
  if (name != "odd") CHECK((loss_kind == OpKind::CrossEntropy || loss_kind == OpKind::LinearCrossEntropy));
  StageModule m(g, 0, g.size(), 0);
  TensorEnv env = m.make_env();
  for (const Node& n : g.nodes)
    if (n.kind == OpKind::Input) env[n.outputs[0]] = read_tensor(ref, "input." + n.name);
  m.forward(env, RunContext{});
  at::Tensor loss = env[g.nodes[g.loss_node()].outputs[0]];
  env.clear();
  loss.backward();
  const double expected = read_tensor(ref, "loss").item<double>();
  CHECK(std::abs(loss.item<double>() - expected) <= tolerance * std::abs(expected));
  std::set<std::string> checked;
  for (const StageParameter& p : m.parameters()) {
    INFO(p.name);
    REQUIRE(ref.contains("grad." + p.name));
    REQUIRE(p.tensor.grad().defined());
    CHECK(p.tensor.grad().scalar_type() == at::kFloat);  // fp32 master weights, also under bf16
    const at::Tensor want = read_tensor(ref, "grad." + p.name);
    if (want.abs().max().item<double>() < 1e-8)  // zero but for rounding (attention key biases)
      CHECK((p.tensor.grad().to(at::kFloat) - want).abs().max().item<double>() < 1e-8);
    else
      CHECK(relative_error(p.tensor.grad(), want) <= tolerance);
    checked.insert("grad." + p.name);
  }
  for (const std::string& key : ref.names())
    if (key.rfind("grad.", 0) == 0) CHECK(checked.count(key) == 1);  // no eager gradient left unchecked
  CHECK(!checked.empty());
}

// Two exports of one model with the same weights (the same seed): the same eager loss and
// gradients in their references.
void check_same_reference(const std::string& name, const std::string& variant) {
  SafetensorsFile a(test_models_dir() + "/" + name + ".ref"), b(test_models_dir() + "/" + variant + ".ref");
  CHECK(read_tensor(b, "loss").item<double>() == Approx(read_tensor(a, "loss").item<double>()).epsilon(1e-6));
  for (const std::string& key : a.names()) {
    if (key.rfind("grad.", 0) != 0) continue;
    INFO(key);
    REQUIRE(b.contains(key));
    const at::Tensor want = read_tensor(a, key);
    if (want.abs().max().item<double>() < 1e-8) continue;  // zero but for rounding (attention key biases)
    CHECK(relative_error(read_tensor(b, key), want) < 1e-5);
  }
}

}  // namespace

TEST_CASE("imported GPT-2 gives eager PyTorch's loss and gradients", "[import]") { check_against_eager("gpt2"); }
TEST_CASE("imported BERT (masked LM) gives eager PyTorch's loss and gradients", "[import]") {
  check_against_eager("bert");
}
TEST_CASE("imported T5 gives eager PyTorch's loss and gradients", "[import]") { check_against_eager("t5"); }
TEST_CASE("imported Llama gives eager PyTorch's loss and gradients", "[import]") { check_against_eager("llama"); }
TEST_CASE("imported Gemma and Falcon and GPT-BigCode give eager PyTorch's loss and gradients", "[import]") {
  for (const char* name : {"gemma", "falcon", "gpt_bigcode"}) check_against_eager(name);
}
TEST_CASE("imported GPT-J, Mixtral (experts), Cohere and CodeGen give eager PyTorch's loss and gradients", "[import]") {
  for (const char* name : {"gptj", "mixtral", "cohere", "codegen"}) check_against_eager(name);
}
TEST_CASE("imported user module gives eager PyTorch's loss and gradients", "[import]") { check_against_eager("odd"); }
// Only a cross-entropy with PyTorch's defaults becomes the zoo's loss (docs/model-format.md):
// label smoothing, another reduction or class weights run as recorded, by ATen.
TEST_CASE("imported cross-entropy calls other than PyTorch's defaults stay ATen calls", "[import]") {
  const std::shared_ptr<const ModelFile> file = read_model_file(test_model("gpt2"));
  CHECK(build_imported(*file, 2).nodes.back().kind == OpKind::CrossEntropy);
  for (const auto& [index, value] : std::vector<std::pair<size_t, Json>>{{5, 0.1}, {3, 2}, {4, 0}}) {
    INFO("argument " << index << " = " << value.dump());
    ModelFile changed = *file;
    Json& args = changed.graph.at("nodes").back().at("args");
    REQUIRE(args.at(0).at("t").get<std::string>().rfind("view", 0) == 0);  // the loss call's logits
    args.at(index) = value;
    const OpGraph g = build_imported(changed, 2);
    CHECK(g.nodes.back().kind == OpKind::Aten);
    CHECK(g.nodes.back().call.op == "aten::cross_entropy_loss");
  }
}

// Exported under torch.autocast: the graph holds autocast's casts, so DawnPiper runs the very
// kernels eager autocast runs.
// export_model.py --loss-chunk-tokens: the head and the loss as dawnpiper::linear_cross_entropy,
// imported as one LinearCrossEntropy node; eager PyTorch's loss and gradients are those of the
// model as Hugging Face computes them.
TEST_CASE("imported models with a fused LM loss give Hugging Face's loss and gradients", "[import]") {
  for (const std::string name : {"gpt2", "bert", "t5"}) {
    INFO(name);
    check_against_eager(name + "_fused");
    const OpGraph fused = build_imported(*read_model_file(test_model(name + "_fused")), 3);
    const OpGraph plain = build_imported(*read_model_file(test_model(name)), 3);
    const Node& loss = fused.nodes[static_cast<size_t>(fused.loss_node())];
    REQUIRE(loss.kind == OpKind::LinearCrossEntropy);
    CHECK(loss.attr_int("chunk_tokens", 0) == 20);
    CHECK(fused.parameter_count() == plain.parameter_count());
    CHECK(fused.size() < plain.size());
    check_same_reference(name, name + "_fused");  // the unfused export's loss and gradients
  }
}

// export_model.py --output-chunks: the output projection as projections over vocabulary ranges
// and a concatenation; the same weights give the whole projection's loss and gradients.
TEST_CASE("imported models with a chunked output projection give Hugging Face's loss and gradients", "[import]") {
  for (const std::string name : {"gpt2", "bert"}) {
    INFO(name);
    check_against_eager(name + "_chunked");
    const OpGraph chunked = build_imported(*read_model_file(test_model(name + "_chunked")), 3);
    const OpGraph plain = build_imported(*read_model_file(test_model(name)), 3);
    CHECK(chunked.parameter_count() == plain.parameter_count());
    CHECK(chunked.size() > plain.size());  // the slices, the two more projections and the concatenation
    check_same_reference(name, name + "_chunked");
  }
}

TEST_CASE("imported bf16 GPT-2 gives eager autocast's loss and gradients", "[import]") {
  check_against_eager("gpt2_bf16", 1e-5);
}

namespace {
// saved_by and bytes per tensor name, data tensors left out (a reshape of a data input is
// saved differently by the two, and data is loaded by every stage anyway).
std::map<std::string, std::pair<std::vector<int>, int64_t>> kept(const Profile& p) {
  std::map<std::string, std::pair<std::vector<int>, int64_t>> out;
  for (const TensorProfile& t : p.tensors)
    if (!t.is_data) out[t.name] = {t.saved_by, t.bytes};
  return out;
}
}  // namespace

TEST_CASE("the analytic profile of imported models keeps what autograd keeps", "[import]") {
  const ProfilerOptions quick = quick_profiler_options();
  const MeasureNode measure = [&](const OpGraph& g, int node) { return measure_node_facts(g, node, quick); };
  // T5's attention takes a float bias that needs a gradient: the CPU runs it unfused (keeping
  // the probabilities), a GPU fused (keeping q, k, v): the analytic profile models the GPU.
  for (const std::string name : {"gpt2", "bert", "llama", "odd"}) {
    INFO(name);
    const OpGraph g = build_imported(*read_model_file(test_model(name)), 2);
    const Profile measured = profile_graph(g, quick);
    const Profile analytic = analytic_profile(g, device_spec("a100-40gb"), measure);
    CHECK(kept(analytic) == kept(measured));
    if (name == "odd") {
      CHECK(analytic.notes.find("aten::cumsum x1") != std::string::npos);
      CHECK(analytic.notes.find("aten::logsumexp x1") != std::string::npos);
      CHECK(analytic.notes.find("measured") != std::string::npos);
      // Without the measurement the guess is written down too.
      CHECK(analytic_profile(g, device_spec("a100-40gb")).notes.find("assumed") != std::string::npos);
    } else {
      CHECK(analytic.notes.empty());
    }
  }
}
