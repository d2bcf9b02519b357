#include "exec/split_backward.h"

#include <map>
#include <set>
#include <utility>

#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <limits>
#include <unordered_set>

#include "util/error.h"

namespace dawnpiper {

namespace {
using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Engine;
using torch::autograd::impl::gradient_edge;

// Whether node `to` reads what node `from` made, directly or through the nodes between them.
bool feeds(const OpGraph& g, int from, int to) {
  std::vector<char> reached(g.nodes.size(), 0);
  reached[static_cast<size_t>(from)] = 1;
  for (int n = from + 1; n <= to; ++n)
    for (int t : g.nodes[static_cast<size_t>(n)].inputs) {
      const int producer = g.tensors[static_cast<size_t>(t)].producer;
      if (producer >= from && reached[static_cast<size_t>(producer)]) reached[static_cast<size_t>(n)] = 1;
    }
  return reached[static_cast<size_t>(to)] != 0;
}

}  // namespace

SplitBackward::SplitBackward(const StageModule& module, int stage, bool exact) : module_(module), exact_(exact) {
  const OpGraph& g = module.graph();
  std::map<int, std::vector<int>> readers;  // parameter -> nodes reading it, in order
  for (int n = module.begin(); n < module.end(); ++n) {
    reads_.push_back(module.parameters_read(n));
    for (int p : reads_.back()) readers[p].push_back(n);
  }
  if (!exact) return;
  for (const auto& [p, nodes] : readers)
    for (size_t i = 0; i < nodes.size(); ++i)
      for (size_t j = i + 1; j < nodes.size(); ++j)
        if (feeds(g, nodes[i], nodes[j]))
          throw ConfigError("stage " + std::to_string(stage) + " cannot split its backward: parameter " +
                            module.parameters()[static_cast<size_t>(p)].name + " is read by " +
                            g.nodes[static_cast<size_t>(nodes[i])].name + " and by " +
                            g.nodes[static_cast<size_t>(nodes[j])].name +
                            ", which reads what the first made (its weight gradient would count the first's "
                            "twice); use a schedule without I and W (1f1b, gpipe) or cut between them");
}

void SplitBackward::record(int node, const TensorEnv& env, WeightRoots& roots) const {
  roots.node_end_seq.resize(reads_.size(), 0);
  roots.node_end_seq[static_cast<size_t>(node - module_.begin())] = at::sequence_number::peek();
  if (reads_[static_cast<size_t>(node - module_.begin())].empty()) return;
  for (int t : module_.graph().nodes[static_cast<size_t>(node)].outputs) {
    const at::Tensor& y = env[t];
    if (!y.defined() || !y.requires_grad()) continue;
    roots.edges.push_back(gradient_edge(y));
    roots.node.push_back(node);
  }
}

std::vector<at::Tensor> SplitBackward::input_pass(const std::vector<at::Tensor>& outputs,
                                                  const std::vector<at::Tensor>& grads,
                                                  const std::vector<at::Tensor>& inputs, WeightRoots& roots) const {
  edge_list from, to;
  for (const at::Tensor& y : outputs) from.push_back(gradient_edge(y));
  for (const at::Tensor& x : inputs) to.push_back(gradient_edge(x));
  to.insert(to.end(), roots.edges.begin(), roots.edges.end());
  std::vector<at::Tensor> got = Engine::get_default_engine().execute(from, grads, /*keep_graph=*/true,
                                                                     /*create_graph=*/false,
                                                                     /*accumulate_grad=*/false, to);
  if (exact_) release_unread(from, roots);  // else W may pass through other nodes' functions
  roots.grads.assign(got.begin() + static_cast<std::ptrdiff_t>(inputs.size()), got.end());
  got.resize(inputs.size());
  own_slices(got, roots.grads);
  return got;
}

// What the input pass leaves is held past it: the inputs' gradients until their send, the roots'
// until W. A gradient that is a slice of a larger one (at::cat's backward hands out slices of its
// output's gradient, and an add hands a slice on to both its inputs) would hold all of it that
// long, though the rest was read in the pass. So the inputs' slices are copied now, and the roots'
// where the regions they hold, each counted once, do not cover their buffer: one copy per region,
// which the inputs and roots holding it share (the replay, plan/stage_replay_walk.cpp, counts the whole
// until the end of the pass, and the copies as the buffers the concat's inputs got).
void SplitBackward::own_slices(std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& roots) {
  at::NoGradGuard no_grad;
  using Region = std::pair<const void*, size_t>;  // where a slice starts, its bytes
  std::map<Region, at::Tensor> copies;
  const auto own = [&](at::Tensor& g) {
    at::Tensor& copy = copies[{g.data_ptr(), g.nbytes()}];
    if (!copy.defined()) copy = g.clone(at::MemoryFormat::Contiguous);
    g = copy;
  };
  for (at::Tensor& g : inputs)
    if (g.defined() && g.nbytes() < g.storage().nbytes()) own(g);
  std::map<const void*, std::set<Region>> held;  // per buffer, the regions the roots hold
  for (const at::Tensor& g : roots)
    if (g.defined()) held[g.storage().data()].insert({g.data_ptr(), g.nbytes()});
  for (at::Tensor& g : roots) {
    if (!g.defined()) continue;
    size_t covered = 0;
    for (const Region& r : held[g.storage().data()]) covered += r.second;
    if (covered < g.storage().nbytes()) own(g);
  }
}

void SplitBackward::release_unread(const edge_list& from, const WeightRoots& roots) const {
  std::vector<uint64_t> end_seq = roots.node_end_seq;  // nodes without a record end where the one before did
  for (size_t k = 1; k < end_seq.size(); ++k) end_seq[k] = std::max(end_seq[k], end_seq[k - 1]);
  std::vector<torch::autograd::Node*> stack;
  for (const Edge& e : from) stack.push_back(e.function.get());
  std::unordered_set<torch::autograd::Node*> seen;
  while (!stack.empty()) {
    torch::autograd::Node* fn = stack.back();
    stack.pop_back();
    if (!fn || !seen.insert(fn).second) continue;
    for (const Edge& e : fn->next_edges()) stack.push_back(e.function.get());
    const uint64_t seq = fn->sequence_nr();
    if (seq == std::numeric_limits<uint64_t>::max()) continue;  // AccumulateGrad
    // Its node: the first whose forward ended after it was made (none: made after the forward,
    // as the loss's scaling; kept).
    const auto owner = std::upper_bound(end_seq.begin(), end_seq.end(), seq);
    if (owner == end_seq.end()) continue;
    if (reads_[static_cast<size_t>(owner - end_seq.begin())].empty()) fn->release_variables();
  }
}

void SplitBackward::weight_pass(WeightRoots& roots, const std::function<void(int)>& before_node) const {
  // Node by node in the backward's order (the latest first), as the memory replay counts.
  for (size_t end = roots.edges.size(); end > 0;) {
    const int node = roots.node[end - 1];
    size_t begin = end;
    while (begin > 0 && roots.node[begin - 1] == node) --begin;
    edge_list from, to;
    std::vector<at::Tensor> grads;
    for (size_t i = begin; i < end; ++i) {
      if (!roots.grads[i].defined()) continue;
      from.push_back(roots.edges[i]);
      grads.push_back(std::move(roots.grads[i]));
    }
    end = begin;
    if (from.empty()) continue;
    for (int p : reads_[static_cast<size_t>(node - module_.begin())])
      to.push_back(gradient_edge(module_.parameters()[static_cast<size_t>(p)].tensor));
    if (before_node) before_node(node);
    Engine::get_default_engine().execute(from, grads, /*keep_graph=*/true, /*create_graph=*/false,
                                         /*accumulate_grad=*/true, to);
  }
  roots = WeightRoots{};
}

}  // namespace dawnpiper
