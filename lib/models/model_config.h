#pragma once
// Model families, size presets and user overrides. Pure C++.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "graph/op_graph.h"

namespace dawnpiper {

enum class ModelFamily { Gpt2, Bert, T5, AmoebaNet, Mlp };
template <>
struct EnumNames<ModelFamily> {
  static constexpr const char* what = "model family";
  static constexpr std::array<std::pair<ModelFamily, const char*>, 5> table{{{ModelFamily::Gpt2, "gpt2"},
                                                                             {ModelFamily::Bert, "bert"},
                                                                             {ModelFamily::T5, "t5"},
                                                                             {ModelFamily::AmoebaNet, "amoebanet"},
                                                                             {ModelFamily::Mlp, "mlp"}}};
};
// gpt2, bert and t5: the transformers with a language-model head.
inline bool is_language_model(ModelFamily family) {
  return family == ModelFamily::Gpt2 || family == ModelFamily::Bert || family == ModelFamily::T5;
}

struct ModelConfig {
  ModelFamily family = ModelFamily::Gpt2;
  std::string preset;
  int64_t layers = 0;          // transformer layers (t5: encoder layers), mlp hidden layers,
                               // amoebanet normal cells per stack
  int64_t decoder_layers = 0;  // t5 only
  int64_t hidden = 0;          // transformer width, mlp width, amoebanet filters
  int64_t heads = 0;
  int64_t ffn = 0;  // feed-forward inner width
  int64_t vocab = 0;
  int64_t seq_len = 0;
  int64_t max_positions = 0;  // learned position table rows (gpt2, bert)
  int64_t image_size = 0;     // amoebanet
  int64_t in_features = 0;    // mlp input width
  int64_t classes = 0;        // amoebanet, mlp
  double dropout = 0.1;
  double mlm_fraction = 0.15;  // bert: share of positions with a label
  // gpt2, bert, t5: the output projection as this many linears over consecutive vocabulary
  // ranges, concatenated before the loss, so that a cut may fall inside it (a small model's LM
  // head is a quarter or more of its step: whole, it sets the bottleneck of 4 stages). 1: one
  // linear, the graph the presets always had.
  int64_t output_chunks = 1;
  // gpt2, bert, t5: > 0 builds the output projection and the loss as one node that computes the
  // logits of this many token positions at a time and recomputes them in backward
  // (OpKind::LinearCrossEntropy): a micro-batch's [tokens, vocab] logits, often a stage's
  // largest tensor, are never held whole. 0: a projection, then the loss.
  int64_t loss_chunk_tokens = 0;
  // gpt2, bert, t5: attention as one aten::scaled_dot_product_attention call (a fused kernel
  // where the device has one: the scores and probabilities are not kept for backward) instead
  // of the op-by-op scores, mask, softmax, dropout and products.
  bool fused_attention = false;
};

// Known preset names, in a stable order.
std::vector<std::string> preset_names();
// Throws ConfigError naming the known presets.
ModelConfig preset_config(const std::string& preset);
// A preset's overrides, typed as the model options of the same names read them: whole numbers
// (layers, decoder-layers, hidden, heads, ffn, vocab, seq-len, image-size, classes, in-features,
// output-chunks, loss-chunk-tokens), the dropout probability and the attention's form.
const std::vector<std::string>& integer_override_names();
// ConfigError for an unknown name or a value below 1.
void set_integer_override(ModelConfig& config, const std::string& name, int64_t value);
// ConfigError outside [0, 1).
void set_dropout(ModelConfig& config, double dropout);
enum class AttentionKind { Ops, Fused };  // --attention
template <>
struct EnumNames<AttentionKind> {
  static constexpr const char* what = "attention";
  static constexpr std::array<std::pair<AttentionKind, const char*>, 2> table{
      {{AttentionKind::Ops, "ops"}, {AttentionKind::Fused, "fused"}}};
  static constexpr std::array<const char*, 2> meaning{
      "the default",
      "each attention as one scaled_dot_product_attention call, which keeps no scores for backward where the "
      "device has a fused kernel"};
};
// Throws ConfigError for inconsistent settings (hidden not divisible by heads, seq-len above the
// position table, image size that the reduction cells cannot halve evenly, ...).
void check_config(const ModelConfig& config);

// Builds the validated OpGraph for one micro-batch of `micro_batch_size` samples, in precision
// "fp32" or "bf16" (ConfigError otherwise).
OpGraph build_model(const ModelConfig& config, int64_t micro_batch_size, Precision precision = Precision::Fp32);

}  // namespace dawnpiper
