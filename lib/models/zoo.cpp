// The model zoo: presets and the OpGraph builders for gpt2, bert, t5, amoebanet and mlp.
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>

#include "models/layer_builder.h"
#include "models/model_config.h"
#include "util/error.h"

namespace dawnpiper {

namespace {

ModelConfig transformer(ModelFamily family, const std::string& preset, int64_t layers, int64_t hidden, int64_t heads,
                        int64_t vocab, int64_t seq_len, int64_t max_positions) {
  ModelConfig c;
  c.family = family;
  c.preset = preset;
  c.layers = layers;
  c.decoder_layers = family == ModelFamily::T5 ? layers : 0;
  c.hidden = hidden;
  c.heads = heads;
  c.ffn = 4 * hidden;
  c.vocab = vocab;
  c.seq_len = seq_len;
  c.max_positions = max_positions;
  return c;
}

ModelConfig amoebanet(const std::string& preset, int64_t cells, int64_t filters, int64_t image, int64_t classes) {
  ModelConfig c;
  c.family = ModelFamily::AmoebaNet;
  c.preset = preset;
  c.layers = cells;
  c.hidden = filters;
  c.image_size = image;
  c.classes = classes;
  return c;
}

ModelConfig mlp(const std::string& preset, int64_t layers, int64_t hidden, int64_t in, int64_t classes) {
  ModelConfig c;
  c.family = ModelFamily::Mlp;
  c.preset = preset;
  c.layers = layers;
  c.hidden = hidden;
  c.in_features = in;
  c.classes = classes;
  return c;
}

// Published sizes: bert-large 24x1024 (Devlin et al.), gpt2-large 36x1280 (Radford et al.),
// t5-large 24+24x1024, d_ff 4096 (Raffel et al.), AmoebaNet-D cells as in torchgpipe.
const std::map<std::string, ModelConfig>& presets() {
  static const std::map<std::string, ModelConfig> table = [] {
    std::map<std::string, ModelConfig> t;
    auto put = [&t](ModelConfig c) { t[c.preset] = c; };
    put(transformer(ModelFamily::Gpt2, "gpt2-tiny", 2, 64, 4, 512, 32, 64));
    put(transformer(ModelFamily::Gpt2, "gpt2-mini", 4, 256, 8, 8192, 128, 128));
    put(transformer(ModelFamily::Gpt2, "gpt2-small", 12, 768, 12, 50257, 1024, 1024));
    put(transformer(ModelFamily::Gpt2, "gpt2-large", 36, 1280, 20, 50257, 1024, 1024));
    put(transformer(ModelFamily::Bert, "bert-tiny", 2, 64, 4, 512, 32, 64));
    put(transformer(ModelFamily::Bert, "bert-mini", 4, 256, 4, 8192, 128, 128));
    put(transformer(ModelFamily::Bert, "bert-base", 12, 768, 12, 30522, 512, 512));
    put(transformer(ModelFamily::Bert, "bert-large", 24, 1024, 16, 30522, 512, 512));
    put(transformer(ModelFamily::T5, "t5-tiny", 2, 64, 4, 512, 32, 0));
    put(transformer(ModelFamily::T5, "t5-mini", 4, 256, 4, 8192, 64, 0));
    put(transformer(ModelFamily::T5, "t5-large", 24, 1024, 16, 32128, 512, 0));
    put(amoebanet("amoebanet-tiny", 1, 16, 32, 10));
    put(amoebanet("amoebanet-mini", 2, 32, 64, 100));
    put(amoebanet("amoebanet-d", 6, 70, 224, 1000));
    put(mlp("mlp-tiny", 3, 128, 64, 10));
    put(mlp("mlp-mini", 6, 1024, 512, 100));
    for (auto& kv : t)
      if (!is_language_model(kv.second.family)) kv.second.dropout = 0;
    return t;
  }();
  return table;
}

// ---------------------------------------------------------------- transformers

struct Attention {
  int64_t heads, head_dim;
  double dropout;
  bool scaled;  // divide scores by sqrt(head_dim) (gpt2, bert); t5 does not
  bool fused;   // one aten::scaled_dot_product_attention call (ModelConfig::fused_attention)
};

// Multi-head attention at op granularity. q from x_q, k and v from x_kv. `bias` (optional,
// -1 for none) is added to the scores: bert's padding mask, t5's relative position bias.
int attention(LayerBuilder& b, const std::string& p, int x_q, int x_kv, const Attention& a, bool causal, int bias,
              bool proj_bias) {
  const Shape& sq = b.shape(x_q);
  const Shape& skv = b.shape(x_kv);
  int64_t B = sq[0], Sq = sq[1], Sk = skv[1], H = a.heads * a.head_dim;
  int q = b.linear(p + ".q", x_q, H, proj_bias);
  int k = b.linear(p + ".k", x_kv, H, proj_bias);
  int v = b.linear(p + ".v", x_kv, H, proj_bias);
  q = b.transpose(p + ".q_heads", b.reshape(p + ".q_view", q, {B, Sq, a.heads, a.head_dim}), {0, 2, 1, 3});
  k = b.transpose(p + ".k_heads", b.reshape(p + ".k_view", k, {B, Sk, a.heads, a.head_dim}), {0, 2, 1, 3});
  v = b.transpose(p + ".v_heads", b.reshape(p + ".v_view", v, {B, Sk, a.heads, a.head_dim}), {0, 2, 1, 3});
  const double scale = a.scaled ? 1.0 / std::sqrt(static_cast<double>(a.head_dim)) : 1.0;
  int ctx = -1;
  if (a.fused) {
    // One call: the mask (an additive bias, with the causal triangle folded in where both
    // apply: the call takes either a mask or is_causal) and the scaling are its arguments.
    if (bias >= 0 && causal) bias = b.causal_mask(p + ".causal", bias);
    ctx = b.scaled_dot_product_attention(p + ".sdpa", q, k, v, bias, a.dropout, causal && bias < 0, scale);
  } else {
    int kt = b.transpose(p + ".k_t", k, {0, 1, 3, 2});
    int s = b.matmul(p + ".scores", q, kt);
    if (a.scaled) s = b.scale(p + ".scale", s, scale);
    if (bias >= 0) s = b.add(p + ".bias", {s, bias});
    if (causal) s = b.causal_mask(p + ".causal", s);
    int probs = b.softmax(p + ".softmax", s);
    if (a.dropout > 0) probs = b.dropout(p + ".attn_drop", probs, a.dropout);
    ctx = b.matmul(p + ".context", probs, v);
  }
  ctx = b.transpose(p + ".merge", ctx, {0, 2, 1, 3});
  ctx = b.reshape(p + ".merge_view", ctx, {B, Sq, H});
  return b.linear(p + ".out", ctx, H, proj_bias);
}

int maybe_dropout(LayerBuilder& b, const std::string& name, int x, double p) {
  return p > 0 ? b.dropout(name, x, p) : x;
}

// The LM head onto the vocabulary and the loss against the labels (an Input of `labels_role`):
// a projection (maybe in chunks, ModelConfig::output_chunks), the labels, a cross-entropy; or
// the labels and one LinearCrossEntropy node named like the head, so that its parameters keep
// the head's names (ModelConfig::loss_chunk_tokens).
void lm_head_and_loss(LayerBuilder& b, const ModelConfig& c, const std::string& head, int x, int tied_owner, bool bias,
                      const std::string& labels_role) {
  Shape positions = b.shape(x);
  positions.pop_back();
  if (c.loss_chunk_tokens > 0) {
    int labels = b.input("labels", positions, DType::I64, labels_role);
    b.linear_cross_entropy(head, x, labels, c.vocab, tied_owner, bias, c.loss_chunk_tokens);
    return;
  }
  int logits = b.output_projection(head, x, c.vocab, c.output_chunks, tied_owner, bias);
  int labels = b.input("labels", positions, DType::I64, labels_role);
  b.cross_entropy("loss", logits, labels);
}

void build_gpt2(const ModelConfig& c, int64_t B, OpGraph& g) {
  LayerBuilder b(g);
  const Attention att{c.heads, c.hidden / c.heads, c.dropout, true, c.fused_attention};
  g.add_block("embed");
  int tokens = b.input("tokens", {B, c.seq_len}, DType::I64, "tokens");
  int wte = b.embedding("wte", tokens, c.vocab, c.hidden);
  int wte_node = g.tensor(wte).producer;
  int wpe = b.pos_embedding("wpe", tokens, c.max_positions, c.hidden);
  int x = maybe_dropout(b, "embed_drop", b.add("embed_sum", {wte, wpe}), c.dropout);
  for (int64_t l = 0; l < c.layers; ++l) {  // pre-LN blocks
    std::string p = "layer" + std::to_string(l);
    g.add_block(p);
    int h = b.layernorm(p + ".ln1", x);
    int a = maybe_dropout(b, p + ".attn_out_drop", attention(b, p + ".attn", h, h, att, true, -1, true), c.dropout);
    x = b.add(p + ".attn_residual", {x, a});
    h = b.layernorm(p + ".ln2", x);
    h = b.unary(OpKind::Gelu, p + ".mlp.gelu", b.linear(p + ".mlp.fc", h, c.ffn));
    h = maybe_dropout(b, p + ".mlp_drop", b.linear(p + ".mlp.proj", h, c.hidden), c.dropout);
    x = b.add(p + ".mlp_residual", {x, h});
  }
  g.add_block("head");
  x = b.layernorm("ln_f", x);
  lm_head_and_loss(b, c, "lm_head", x, wte_node, false, "tokens_next");
}

// BERT-style encoder with an MLM head, as in the original PyTorch port (post-LN, unfused
// LayerNorm and erf-GELU: every intermediate is an op of its own, as torch.fx sees it).
void build_bert(const ModelConfig& c, int64_t B, OpGraph& g) {
  LayerBuilder b(g);
  const Attention att{c.heads, c.hidden / c.heads, c.dropout, true, c.fused_attention};
  g.add_block("embed");
  int tokens = b.input("tokens", {B, c.seq_len}, DType::I64, "mlm_tokens");
  int word = b.embedding("word_embeddings", tokens, c.vocab, c.hidden);
  int word_node = g.tensor(word).producer;
  int pos = b.pos_embedding("position_embeddings", tokens, c.max_positions, c.hidden);
  int x = b.layernorm_unfused("embed_ln", b.add("embed_sum", {word, pos}));
  x = maybe_dropout(b, "embed_drop", x, c.dropout);
  int mask = b.input("attn_mask", {B, 1, 1, c.seq_len}, DType::F32, "zeros");  // additive padding mask
  for (int64_t l = 0; l < c.layers; ++l) {
    std::string p = "layer" + std::to_string(l);
    g.add_block(p);
    int a = maybe_dropout(b, p + ".attn_out_drop", attention(b, p + ".attn", x, x, att, false, mask, true), c.dropout);
    x = b.layernorm_unfused(p + ".attn_ln", b.add(p + ".attn_residual", {a, x}));
    int h = b.gelu_unfused(p + ".ffn.gelu", b.linear(p + ".ffn.fc", x, c.ffn));
    h = maybe_dropout(b, p + ".ffn_drop", b.linear(p + ".ffn.proj", h, c.hidden), c.dropout);
    x = b.layernorm_unfused(p + ".ffn_ln", b.add(p + ".ffn_residual", {h, x}));
  }
  g.add_block("head");
  int h = b.gelu_unfused("mlm.gelu", b.linear("mlm.transform", x, c.hidden));
  h = b.layernorm_unfused("mlm.ln", h);
  lm_head_and_loss(b, c, "mlm.decoder", h, word_node, true, "mlm_labels");  // labels -100 where not masked
}

// T5 encoder-decoder (pre-RMSNorm, ReLU FFN, no biases, relative position bias computed in the
// first layer of each stack and shared by the others). The LM head is untied, as in T5 v1.1;
// with the v1.0 (t5-large) dimensions that gives ~771M parameters.
void build_t5(const ModelConfig& c, int64_t B, OpGraph& g) {
  LayerBuilder b(g);
  const Attention att{c.heads, c.hidden / c.heads, c.dropout, false, c.fused_attention};
  const int64_t buckets = 32, max_distance = 128;
  g.add_block("encoder.embed");
  int tokens = b.input("tokens", {B, c.seq_len}, DType::I64, "tokens");
  int emb = b.embedding("shared_embedding", tokens, c.vocab, c.hidden);
  int emb_node = g.tensor(emb).producer;
  int x = maybe_dropout(b, "encoder.embed_drop", emb, c.dropout);
  int enc_bias = -1;
  for (int64_t l = 0; l < c.layers; ++l) {
    std::string p = "encoder.layer" + std::to_string(l);
    g.add_block(p);
    int h = b.rmsnorm(p + ".ln1", x);
    if (enc_bias < 0)
      enc_bias = b.rel_pos_bias(p + ".rel_bias", h, c.heads, buckets, max_distance, true, c.seq_len, c.seq_len);
    int a = maybe_dropout(b, p + ".attn_drop", attention(b, p + ".attn", h, h, att, false, enc_bias, false), c.dropout);
    x = b.add(p + ".attn_residual", {x, a});
    h = b.unary(OpKind::Relu, p + ".ffn.relu", b.linear(p + ".ffn.wi", b.rmsnorm(p + ".ln2", x), c.ffn, false));
    h = maybe_dropout(b, p + ".ffn.drop", h, c.dropout);
    h = maybe_dropout(b, p + ".ffn_drop", b.linear(p + ".ffn.wo", h, c.hidden, false), c.dropout);
    x = b.add(p + ".ffn_residual", {x, h});
  }
  g.add_block("encoder.final");
  int enc = maybe_dropout(b, "encoder.final_drop", b.rmsnorm("encoder.final_ln", x), c.dropout);

  g.add_block("decoder.embed");
  int dec_tokens = b.input("dec_tokens", {B, c.seq_len}, DType::I64, "dec_tokens");  // labels shifted right
  x = maybe_dropout(b, "decoder.embed_drop", b.tied_embedding("decoder.embedding", dec_tokens, emb_node), c.dropout);
  int dec_bias = -1;
  for (int64_t l = 0; l < c.decoder_layers; ++l) {
    std::string p = "decoder.layer" + std::to_string(l);
    g.add_block(p);
    int h = b.rmsnorm(p + ".ln1", x);
    if (dec_bias < 0) {
      dec_bias = b.rel_pos_bias(p + ".rel_bias", h, c.heads, buckets, max_distance, false, c.seq_len, c.seq_len);
      // Fused attention takes the causal triangle in its mask: masked once, shared by the layers.
      if (c.fused_attention) dec_bias = b.causal_mask(p + ".causal_bias", dec_bias);
    }
    int a = maybe_dropout(b, p + ".self_drop",
                          attention(b, p + ".self", h, h, att, !c.fused_attention, dec_bias, false), c.dropout);
    x = b.add(p + ".self_residual", {x, a});
    h = b.rmsnorm(p + ".ln2", x);
    a = maybe_dropout(b, p + ".cross_drop", attention(b, p + ".cross", h, enc, att, false, -1, false), c.dropout);
    x = b.add(p + ".cross_residual", {x, a});
    h = b.unary(OpKind::Relu, p + ".ffn.relu", b.linear(p + ".ffn.wi", b.rmsnorm(p + ".ln3", x), c.ffn, false));
    h = maybe_dropout(b, p + ".ffn.drop", h, c.dropout);
    h = maybe_dropout(b, p + ".ffn_drop", b.linear(p + ".ffn.wo", h, c.hidden, false), c.dropout);
    x = b.add(p + ".ffn_residual", {x, h});
  }
  g.add_block("head");
  x = maybe_dropout(b, "decoder.final_drop", b.rmsnorm("decoder.final_ln", x), c.dropout);
  lm_head_and_loss(b, c, "lm_head", x, -1, false, "tokens");
}

// ---------------------------------------------------------------- amoebanet

// AmoebaNet-D cells (Real et al. 2019; genotype as in torchgpipe's benchmark model). Each entry
// is (input state, operation); pairs of entries are summed into a new state.
enum class CellOp { Conv1x1, Conv3x3, Conv1x7_7x1, MaxPool3x3, MaxPool2x2, AvgPool3x3, None };
struct CellEntry {
  int state;
  CellOp op;
};
const std::vector<CellEntry> kNormalCell = {{1, CellOp::Conv1x1},     {1, CellOp::MaxPool3x3}, {1, CellOp::None},
                                            {0, CellOp::Conv1x7_7x1}, {0, CellOp::Conv1x1},    {0, CellOp::Conv1x7_7x1},
                                            {2, CellOp::MaxPool3x3},  {2, CellOp::None},       {1, CellOp::AvgPool3x3},
                                            {5, CellOp::Conv1x1}};
const std::vector<int> kNormalConcat = {0, 3, 4, 6};
const std::vector<CellEntry> kReductionCell = {
    {0, CellOp::MaxPool2x2},  {0, CellOp::MaxPool3x3}, {2, CellOp::None}, {1, CellOp::Conv3x3},
    {2, CellOp::Conv1x7_7x1}, {2, CellOp::MaxPool3x3}, {3, CellOp::None}, {1, CellOp::MaxPool2x2},
    {2, CellOp::AvgPool3x3},  {3, CellOp::Conv1x1}};
const std::vector<int> kReductionConcat = {4, 5, 6};

class AmoebaBuilder {
 public:
  explicit AmoebaBuilder(LayerBuilder& b) : b_(b) {}

  // relu -> conv -> batchnorm
  int relu_conv_bn(const std::string& p, int x, int64_t c, int64_t k, int64_t stride) {
    int r = b_.unary(OpKind::Relu, p + ".relu", x);
    return b_.batchnorm2d(p + ".bn", b_.conv2d(p + ".conv", r, c, k, k, stride, k / 2, k / 2));
  }

  int op(const std::string& p, CellOp kind, int x, int64_t c, int64_t stride) {
    switch (kind) {
      case CellOp::Conv1x1:
        return relu_conv_bn(p, x, c, 1, stride);
      case CellOp::Conv3x3:
        return relu_conv_bn(p, x, c, 3, stride);
      case CellOp::Conv1x7_7x1: {
        int r = b_.unary(OpKind::Relu, p + ".relu", x);
        int y = b_.conv2d(p + ".conv1x7", r, c, 1, 7, 1, 0, 3);
        y = b_.conv2d(p + ".conv7x1", y, c, 7, 1, stride, 3, 0);
        return b_.batchnorm2d(p + ".bn", y);
      }
      case CellOp::MaxPool3x3:
        return b_.pool2d(OpKind::MaxPool2d, p + ".maxpool", x, 3, stride, 1);
      case CellOp::MaxPool2x2:
        return stride == 1 ? b_.pool2d(OpKind::MaxPool2d, p + ".maxpool", x, 3, 1, 1)
                           : b_.pool2d(OpKind::MaxPool2d, p + ".maxpool", x, 2, 2, 0);
      case CellOp::AvgPool3x3:
        return b_.pool2d(OpKind::AvgPool2d, p + ".avgpool", x, 3, stride, 1);
      case CellOp::None:
        // Identity; with stride 2 a 1x1 strided conv keeps the shapes of the sum consistent.
        return stride == 1 ? x : relu_conv_bn(p, x, c, 1, stride);
    }
    return x;
  }

  // One cell: preprocess both inputs to `c` channels, build 5 summed states, concatenate.
  int cell(const std::string& p, int s0, int s1, int64_t c, bool reduction) {
    const auto& entries = reduction ? kReductionCell : kNormalCell;
    const auto& concat = reduction ? kReductionConcat : kNormalConcat;
    // s0 may come from before the previous reduction: bring it to s1's resolution.
    int64_t ratio = b_.shape(s0)[2] / b_.shape(s1)[2];
    std::vector<int> states{relu_conv_bn(p + ".pre0", s0, c, 1, ratio), relu_conv_bn(p + ".pre1", s1, c, 1, 1)};
    for (size_t i = 0; i < entries.size(); i += 2) {
      std::string n = p + ".node" + std::to_string(i / 2 + 2);
      int64_t st_a = reduction && entries[i].state < 2 ? 2 : 1;
      int64_t st_b = reduction && entries[i + 1].state < 2 ? 2 : 1;
      int a = op(n + ".a", entries[i].op, states.at(entries[i].state), c, st_a);
      int bb = op(n + ".b", entries[i + 1].op, states.at(entries[i + 1].state), c, st_b);
      states.push_back(b_.add(n + ".sum", {a, bb}));
    }
    std::vector<int> outs;
    for (int i : concat) outs.push_back(states.at(i));
    return b_.concat(p + ".concat", outs, 1);
  }

 private:
  LayerBuilder& b_;
};

void build_amoebanet(const ModelConfig& c, int64_t B, OpGraph& g) {
  LayerBuilder b(g);
  AmoebaBuilder am(b);
  const int64_t F = c.hidden;
  g.add_block("stem");
  int images = b.input("images", {B, 3, c.image_size, c.image_size}, DType::F32, "prototype");
  int x = b.batchnorm2d("stem.bn", b.conv2d("stem.conv", images, F / 4, 3, 3, 2, 1, 1));
  // Two reduction cells bring the stem to 1/8 resolution (ImageNet stem), then three stacks of
  // normal cells separated by reductions, channels doubling at each reduction.
  int s0 = x, s1 = x;
  int cell_index = 0;
  auto add_cell = [&](int64_t channels, bool reduction) {
    std::string p = "cell" + std::to_string(cell_index++);
    g.add_block(p);
    int out = am.cell(p, s0, s1, channels, reduction);
    s0 = s1;
    s1 = out;
  };
  add_cell(F / 2, true);
  add_cell(F, true);
  for (int stack = 0; stack < 3; ++stack) {
    if (stack > 0) add_cell(F << stack, true);
    for (int64_t i = 0; i < c.layers; ++i) add_cell(F << stack, false);
  }
  g.add_block("head");
  int pooled = b.global_avgpool("head.pool", b.unary(OpKind::Relu, "head.relu", s1));
  int logits = b.linear("head.fc", pooled, c.classes, true, 0.01);
  int labels = b.input("labels", {B}, DType::I64, "class");
  b.cross_entropy("loss", logits, labels);
}

// ---------------------------------------------------------------- mlp

void build_mlp(const ModelConfig& c, int64_t B, OpGraph& g) {
  LayerBuilder b(g);
  g.add_block("input");
  int x = b.input("features", {B, c.in_features}, DType::F32, "prototype");
  for (int64_t l = 0; l < c.layers; ++l) {
    std::string p = "layer" + std::to_string(l);
    g.add_block(p);
    const double he = std::sqrt(2.0 / static_cast<double>(b.shape(x).back()));  // He init
    x = b.unary(OpKind::Relu, p + ".relu", b.linear(p + ".fc", x, c.hidden, true, he));
  }
  g.add_block("head");
  int logits = b.linear("head.fc", x, c.classes, true, 0.01);
  int labels = b.input("labels", {B}, DType::I64, "class");
  b.cross_entropy("loss", logits, labels);
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& kv : presets()) names.push_back(kv.first);
  return names;
}

ModelConfig preset_config(const std::string& preset) {
  auto it = presets().find(preset);
  if (it == presets().end()) {
    std::string known;
    for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    throw ConfigError("unknown model '" + preset + "' (known presets: " + known + ")");
  }
  return it->second;
}

namespace {
// Each integer override and the field it sets.
const std::vector<std::pair<std::string, int64_t ModelConfig::*>>& integer_overrides() {
  static const std::vector<std::pair<std::string, int64_t ModelConfig::*>> fields{
      {"layers", &ModelConfig::layers},
      {"decoder-layers", &ModelConfig::decoder_layers},
      {"hidden", &ModelConfig::hidden},
      {"heads", &ModelConfig::heads},
      {"ffn", &ModelConfig::ffn},
      {"vocab", &ModelConfig::vocab},
      {"seq-len", &ModelConfig::seq_len},
      {"image-size", &ModelConfig::image_size},
      {"classes", &ModelConfig::classes},
      {"in-features", &ModelConfig::in_features},
      {"output-chunks", &ModelConfig::output_chunks},
      {"loss-chunk-tokens", &ModelConfig::loss_chunk_tokens},
  };
  return fields;
}
}  // namespace

const std::vector<std::string>& integer_override_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all;
    for (const auto& [name, field] : integer_overrides()) all.push_back(name);
    return all;
  }();
  return names;
}

void set_integer_override(ModelConfig& c, const std::string& name, int64_t value) {
  for (const auto& [key, field] : integer_overrides()) {
    if (key != name) continue;
    if (value < 1) throw ConfigError("--" + name + " " + std::to_string(value) + " must be a positive integer");
    c.*field = value;
    if (name == "seq-len" && c.max_positions > 0 && c.max_positions < value) c.max_positions = value;
    return;
  }
  throw ConfigError("unknown model override '" + name + "'");
}

void set_dropout(ModelConfig& c, double dropout) {
  if (!(dropout >= 0 && dropout < 1)) {
    char given[32];
    std::snprintf(given, sizeof given, "%g", dropout);
    throw ConfigError(std::string("dropout must be in [0, 1), got ") + given);
  }
  c.dropout = dropout;
}

void check_config(const ModelConfig& c) {
  const std::string who = "model " + c.preset + ": ";
  const bool language_model = is_language_model(c.family);
  if (language_model) {
    if (c.heads < 1 || c.hidden % c.heads != 0)
      throw ConfigError(who + "hidden (" + std::to_string(c.hidden) + ") must be divisible by heads (" +
                        std::to_string(c.heads) + ")");
    if (c.max_positions > 0 && c.seq_len > c.max_positions)
      throw ConfigError(who + "seq-len " + std::to_string(c.seq_len) + " exceeds the position table (" +
                        std::to_string(c.max_positions) + ")");
    if (c.output_chunks > c.vocab)
      throw ConfigError(who + "output-chunks (" + std::to_string(c.output_chunks) + ") exceeds the vocabulary (" +
                        std::to_string(c.vocab) + ")");
  } else if (c.family == ModelFamily::AmoebaNet) {
    if (c.hidden < 4) throw ConfigError(who + "filters (hidden) must be at least 4");
    // stem conv + 4 reductions halve the image 5 times; each reduction needs an even input.
    if (c.image_size % 32 != 0)
      throw ConfigError(who + "image-size must be a multiple of 32, got " + std::to_string(c.image_size));
  }
  if (!language_model && c.output_chunks != 1)
    throw ConfigError(who + "output-chunks splits a language model's output projection (gpt2, bert, t5), not " +
                      name_of(c.family) + "'s classifier");
  if (!language_model && c.loss_chunk_tokens != 0)
    throw ConfigError(who + "loss-chunk-tokens fuses a language model's output projection with its loss (gpt2, bert, " +
                      "t5), not " + name_of(c.family) + "'s classifier");
  if (!language_model && c.fused_attention)
    throw ConfigError(who + "attention=fused changes a transformer's attention (gpt2, bert, t5), not " +
                      name_of(c.family) + "'s layers");
  if (c.loss_chunk_tokens != 0 && c.output_chunks != 1)
    throw ConfigError(who + "output-chunks and loss-chunk-tokens exclude each other: the first splits the output " +
                      "projection into nodes a cut may fall between, the second fuses it with the loss into one");
}

OpGraph build_model(const ModelConfig& config, int64_t micro_batch_size, Precision precision) {
  if (micro_batch_size < 1) throw ConfigError("micro-batch size must be at least 1");
  check_config(config);
  OpGraph g;
  g.model = name_of(config.family);
  g.preset = config.preset;
  g.micro_batch_size = micro_batch_size;
  switch (config.family) {
    case ModelFamily::Gpt2:
      build_gpt2(config, micro_batch_size, g);
      break;
    case ModelFamily::Bert:
      build_bert(config, micro_batch_size, g);
      break;
    case ModelFamily::T5:
      build_t5(config, micro_batch_size, g);
      break;
    case ModelFamily::AmoebaNet:
      build_amoebanet(config, micro_batch_size, g);
      break;
    case ModelFamily::Mlp:
      build_mlp(config, micro_batch_size, g);
      break;
  }
  g.validate();
  if (precision == Precision::Bf16) {  // bf16 activations; the loss stays fp32
    g.precision = precision;
    const int loss = g.nodes[g.loss_node()].outputs[0];
    for (TensorInfo& t : g.tensors)
      if (t.dtype == DType::F32 && t.id != loss) t.dtype = DType::BF16;
  }
  return g;
}

}  // namespace dawnpiper
