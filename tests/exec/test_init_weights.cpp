// --init-from checked before any work: the checkpoint's header must name every parameter the
// model reads from files (or a tied name) in its shape; one message for the first mismatch.
#include "torch_test.h"

#include <cstdio>
#include <vector>

#include "exec/weights.h"
#include "util/error.h"
#include "util/safetensors.h"

using namespace dawnpiper;

namespace {
ParamSpec file_param(const std::string& source, Shape shape, std::vector<std::string> aliases = {}) {
  ParamSpec p;
  p.name = "weight";
  p.shape = std::move(shape);
  p.init = Init::File;
  p.source = source;
  p.aliases = std::move(aliases);
  return p;
}

// Writes a safetensors file of zeros with these names and shapes.
std::string checkpoint(const std::string& name, const std::vector<std::pair<std::string, Shape>>& entries) {
  const std::string path = "/tmp/dp-test-init-" + name + ".safetensors";
  static std::vector<float> zeros(4096, 0.0f);
  std::vector<SafetensorsTensor> tensors;
  for (const auto& [n, shape] : entries) tensors.push_back({n, DType::F32, shape, zeros.data()});
  write_safetensors(path, tensors);
  return path;
}
}  // namespace

TEST_CASE("a checkpoint of another model (--init-from) is refused from its header, naming the first mismatch",
          "[exec]") {
  OpGraph g;
  g.preset = "model.dpm";
  Node embed, head;
  embed.params = {file_param("wte.weight", {16, 8}, {"lm_head.weight"})};
  head.params = {file_param("h.0.weight", {8, 8}), file_param("h.0.bias", {8})};
  g.nodes = {embed, head};
  const std::string model = checkpoint("model", {{"wte.weight", {16, 8}}, {"h.0.weight", {8, 8}}, {"h.0.bias", {8}}});

  g.weight_files = {model};  // no --init-from: nothing to check
  CHECK_NOTHROW(check_init_weights(g));
  // Every parameter, one under its tied name: fits.
  g.weight_files = {checkpoint("fits", {{"lm_head.weight", {16, 8}}, {"h.0.weight", {8, 8}}, {"h.0.bias", {8}}}),
                    model};
  CHECK_NOTHROW(check_init_weights(g));
  // Another model: a wider embedding, no bias.
  g.weight_files = {checkpoint("other", {{"wte.weight", {32, 8}}, {"h.0.weight", {8, 8}}}), model};
  CHECK_THROWS_WITH(check_init_weights(g),
                    Catch::Contains("does not fit model.dpm: weight wte.weight has shape [32, 8], the model needs "
                                    "[16, 8] (and 1 more weights missing or of another shape)"));
  for (const char* name : {"model", "fits", "other"})
    std::remove(("/tmp/dp-test-init-" + std::string(name) + ".safetensors").c_str());
}
