#pragma once
// Seeded synthetic Profiles for planner tests: chains and small DAGs with long skip edges, random
// times and bytes, saved tensors; plus a transformer-shaped generator for speed measurements.
// Every profile has node 0 = data input (its tensor is_data), one output tensor per node, and
// linear batch-size fits (bytes and times proportional to the micro-batch size).
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "profile/profile.h"

namespace dawnpiper {
namespace testing {

struct SyntheticOptions {
  int nodes = 20;
  int nodes_per_block = 3;
  double skip_probability = 0;  // chance that a node also reads an earlier non-adjacent output
  double fwd_min_ms = 0.2, fwd_max_ms = 2.0;
  double bwd_ratio_min = 1.5, bwd_ratio_max = 2.5;
  int64_t bytes_min = 100000, bytes_max = 2000000;  // activation per micro-batch
  int64_t param_min = 0, param_max = 3000000;
  int64_t workspace_max = 200000;
  double save_input_probability = 0.8;   // e.g. linear saves its input
  double save_output_probability = 0.3;  // e.g. softmax / gelu save their output
  // Theorem condition 3 (memory optimization opportunities evenly spread): every node saves
  // its input and a node's forward time is proportional to the bytes of its output.
  bool uniform_memopt = false;
};

inline NodeProfile make_node(int id, const std::string& kind, int block) {
  NodeProfile n;
  n.id = id;
  n.name = kind + std::to_string(id);
  n.kind = kind;
  n.block = block;
  return n;
}

// Sets the value at micro-batch size 1 and a fit proportional to the batch size.
inline void set_time(NodeProfile& n, double fwd, double bwd) {
  n.fwd_ms = fwd;
  n.bwd_ms = bwd;
  n.recompute_ms = fwd;
  n.fwd_ms_fit = {0, fwd};
  n.bwd_ms_fit = {0, bwd};
}

inline void set_workspace(NodeProfile& n, int64_t bytes) {
  n.fwd_workspace = n.bwd_workspace = bytes;
  n.fwd_workspace_fit = n.bwd_workspace_fit = {0, static_cast<double>(bytes)};
}

inline int add_tensor(Profile& p, int producer, int64_t bytes, bool is_data = false) {
  TensorProfile t;
  t.id = static_cast<int>(p.tensors.size());
  t.producer = producer;
  t.is_data = is_data;
  t.bytes = bytes;
  t.bytes_fit = {0, static_cast<double>(bytes)};
  p.tensors.push_back(t);
  p.nodes[static_cast<size_t>(producer)].outputs.push_back(t.id);
  return t.id;
}

inline void consume(Profile& p, int node, int tensor) {
  std::vector<int>& c = p.tensors[static_cast<size_t>(tensor)].consumers;
  if (std::find(c.begin(), c.end(), node) == c.end()) c.push_back(node);
}

inline void save(Profile& p, int node, int tensor) {
  std::vector<int>& s = p.tensors[static_cast<size_t>(tensor)].saved_by;
  if (std::find(s.begin(), s.end(), node) != s.end()) return;
  s.push_back(node);
  p.nodes[static_cast<size_t>(node)].saved.push_back(tensor);
}

inline Profile random_profile(uint64_t seed, const SyntheticOptions& o) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng); };
  auto integer = [&](int64_t a, int64_t b) { return std::uniform_int_distribution<int64_t>(a, b)(rng); };
  auto chance = [&](double p) { return uniform(0, 1) < p; };

  Profile p;
  p.model = "synthetic";
  p.preset = "synthetic-" + std::to_string(seed);
  p.source = ProfileSource::Analytic;
  p.micro_batch_size = 1;
  p.profiled_batch_sizes = {1, 2};
  int blocks = (o.nodes + o.nodes_per_block - 1) / o.nodes_per_block;
  for (int b = 0; b < blocks; ++b) p.blocks.push_back("block" + std::to_string(b));

  p.nodes.push_back(make_node(0, "input", 0));
  int data = add_tensor(p, 0, 4096, /*is_data=*/true);
  for (int i = 1; i < o.nodes; ++i) {
    NodeProfile n = make_node(i, i + 1 == o.nodes ? "loss" : "op", i / o.nodes_per_block);
    int64_t bytes = integer(o.bytes_min, o.bytes_max);
    double fwd = o.uniform_memopt ? o.fwd_max_ms * static_cast<double>(bytes) / static_cast<double>(o.bytes_max)
                                  : uniform(o.fwd_min_ms, o.fwd_max_ms);
    set_time(n, fwd, fwd * uniform(o.bwd_ratio_min, o.bwd_ratio_max));
    n.param_bytes = integer(o.param_min, o.param_max);
    set_workspace(n, integer(0, o.workspace_max));
    p.nodes.push_back(n);
    int in = i == 1 ? data : static_cast<int>(p.nodes[static_cast<size_t>(i) - 1].outputs[0]);
    int out = add_tensor(p, i, i + 1 == o.nodes ? 4 : bytes);
    consume(p, i, in);
    if (o.uniform_memopt || chance(o.save_input_probability)) save(p, i, in);
    if (!o.uniform_memopt && i + 1 < o.nodes && chance(o.save_output_probability)) save(p, i, out);
    if (i >= 3 && chance(o.skip_probability)) {  // a long edge from an earlier node
      int from = static_cast<int>(integer(1, i - 2));
      int skip = p.nodes[static_cast<size_t>(from)].outputs[0];
      consume(p, i, skip);
      if (chance(0.5)) save(p, i, skip);
    }
  }
  consume(p, o.nodes - 1, data);  // labels read by the loss
  return p;
}

// A transformer-shaped profile for speed measurements: `layers` blocks of a fixed op pattern
// with residual edges (about 20 nodes per layer) between an embedding and a head.
inline Profile transformer_like_profile(int layers, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  auto jitter = [&]() { return std::uniform_real_distribution<double>(0.9, 1.1)(rng); };
  Profile p;
  p.model = "transformer-like";
  p.preset = "transformer-like-" + std::to_string(layers);
  p.micro_batch_size = 1;
  p.profiled_batch_sizes = {1, 2};
  const int64_t h = 1 << 20;  // hidden activation bytes per micro-batch
  int node = 0;
  auto add = [&](const std::string& kind, int block, double fwd, int64_t params, std::vector<int> inputs,
                 int64_t out_bytes, bool save_inputs, bool save_output) {
    NodeProfile n = make_node(node, kind, block);
    double f = fwd * jitter();
    set_time(n, f, 2 * f);
    n.param_bytes = params;
    set_workspace(n, out_bytes / 2);
    p.nodes.push_back(n);
    int out = add_tensor(p, node, out_bytes);
    for (int t : inputs) {
      consume(p, node, t);
      if (save_inputs) save(p, node, t);
    }
    if (save_output) save(p, node, out);
    ++node;
    return out;
  };
  p.blocks.push_back("embed");
  int data = add("input", 0, 0, 0, {}, 8192, false, false);
  p.tensors[static_cast<size_t>(data)].is_data = true;
  int x = add("embedding", 0, 0.05, 64 * h, {data}, h, true, false);
  for (int l = 0; l < layers; ++l) {
    int b = l + 1;
    p.blocks.push_back("layer" + std::to_string(l));
    int ln1 = add("layernorm", b, 0.02, 8192, {x}, h, true, false);
    int q = add("linear", b, 0.1, 4 * h, {ln1}, h, true, false);
    int k = add("linear", b, 0.1, 4 * h, {ln1}, h, true, false);
    int v = add("linear", b, 0.1, 4 * h, {ln1}, h, true, false);
    int qv = add("view", b, 0.0, 0, {q}, h, false, false);
    int kt = add("transpose", b, 0.0, 0, {k}, h, false, false);
    int s = add("matmul", b, 0.08, 0, {qv, kt}, 2 * h, true, false);
    int sc = add("scale", b, 0.01, 0, {s}, 2 * h, false, false);
    int sm = add("softmax", b, 0.03, 0, {sc}, 2 * h, false, true);
    int dr = add("dropout", b, 0.02, 0, {sm}, 2 * h, false, true);
    int av = add("matmul", b, 0.08, 0, {dr, v}, h, true, false);
    int o = add("linear", b, 0.1, 4 * h, {av}, h, true, false);
    int r1 = add("add", b, 0.01, 0, {x, o}, h, false, false);
    int ln2 = add("layernorm", b, 0.02, 8192, {r1}, h, true, false);
    int f1 = add("linear", b, 0.4, 16 * h, {ln2}, 4 * h, true, false);
    int g = add("gelu", b, 0.04, 0, {f1}, 4 * h, true, false);
    int f2 = add("linear", b, 0.4, 16 * h, {g}, h, true, false);
    int d2 = add("dropout", b, 0.01, 0, {f2}, h, false, true);
    x = add("add", b, 0.01, 0, {r1, d2}, h, false, false);
  }
  p.blocks.push_back("head");
  int hb = layers + 1;
  int lnf = add("layernorm", hb, 0.02, 8192, {x}, h, true, false);
  int logits = add("linear", hb, 0.5, 64 * h, {lnf}, 8 * h, true, false);
  add("loss", hb, 0.05, 0, {logits, data}, 4, true, false);
  return p;
}

}  // namespace testing
}  // namespace dawnpiper
