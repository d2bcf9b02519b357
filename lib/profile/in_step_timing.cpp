#include "profile/in_step_timing.h"

#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_set>

#include "data/synthetic.h"
#include "exec/split_backward.h"
#include "exec/stage_module.h"
#include "memory/device_memory.h"
#include "profile/device_timer.h"

namespace dawnpiper {

namespace {

// Marks the backward timeline when the autograd engine is about to run a function.
struct MarkBeforeBackward : torch::autograd::FunctionPreHook {
  MarkBeforeBackward(DeviceTimer& timer, int owner) : timer(timer), owner(owner) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    timer.mark(owner);
    return grads;
  }
  DeviceTimer& timer;
  int owner;
};

// Hooks every autograd function reachable from `root` to the node that created it: the last
// node whose forward started at or before the function's sequence number. AccumulateGrad
// (no sequence number, and reused across steps) is left alone: its time goes to the function
// that ran before it, the one that produced the gradient.
void hook_backward(const std::shared_ptr<torch::autograd::Node>& root, const std::vector<uint64_t>& node_seq,
                   DeviceTimer& timer) {
  std::vector<torch::autograd::Node*> stack{root.get()};
  std::unordered_set<torch::autograd::Node*> seen;
  while (!stack.empty()) {
    torch::autograd::Node* fn = stack.back();
    stack.pop_back();
    if (!fn || !seen.insert(fn).second) continue;
    for (const torch::autograd::Edge& e : fn->next_edges()) stack.push_back(e.function.get());
    const uint64_t seq = fn->sequence_nr();
    if (seq == std::numeric_limits<uint64_t>::max()) continue;
    const auto it = std::upper_bound(node_seq.begin(), node_seq.end(), seq);
    if (it == node_seq.begin()) continue;
    fn->add_pre_hook(std::make_unique<MarkBeforeBackward>(timer, static_cast<int>(it - node_seq.begin()) - 1));
  }
}

void mean_std(const std::vector<std::vector<double>>& samples, std::vector<double>& mean, std::vector<double>& sd) {
  const size_t nodes = samples.empty() ? 0 : samples[0].size();
  mean.assign(nodes, 0);
  sd.assign(nodes, 0);
  const double k = static_cast<double>(samples.size());
  for (size_t n = 0; n < nodes; ++n) {
    for (const auto& s : samples) mean[n] += s[n] / k;
    double var = 0;
    for (const auto& s : samples) var += (s[n] - mean[n]) * (s[n] - mean[n]);
    sd[n] = samples.size() > 1 ? std::sqrt(var / (k - 1)) : 0;
  }
}

// Each node's part of a split backward's weight pass (exec/split_backward.h) in a step on the
// same data: what a zero-bubble schedule's W of the node takes.
std::vector<double> weight_pass_ms(const StageModule& module, TensorEnv env, int it, int loss_id, c10::Device dev) {
  const SplitBackward split(module, 0, /*exact=*/false);  // timing only: tied uses may count twice
  WeightRoots roots;
  module.forward(env, RunContext{it, it}, {}, [&](int n, TensorEnv& e) { split.record(n, e, roots); });
  at::Tensor loss = env[loss_id];
  env.clear();
  split.input_pass({loss}, {at::ones_like(loss)}, {}, roots);
  DeviceTimer timer(dev);
  synchronize(dev);
  split.weight_pass(roots, [&](int n) { timer.mark(n); });
  timer.mark(-1);
  return timer.totals_ms(module.end());
}

}  // namespace

InStepTiming measure_in_step(const OpGraph& g, const ProfilerOptions& opt) {
  const c10::Device dev = opt.device;
  const int N = g.size();
  StageModule module(g, 0, N, opt.seed, dev);
  SyntheticData data(g, opt.seed);
  const std::vector<int> wanted = g.data_inputs(0, N);
  const int loss_node = g.loss_node();
  const int loss_id = g.nodes[loss_node].outputs[0];
  std::vector<std::vector<double>> fwd, bwd, weight;
  double plain_ms = 0;
  for (int it = 0; it < opt.warmup + opt.iterations; ++it) {
    TensorEnv env = module.make_env();
    data.load(env, wanted, data.first_sample(it, 0, 1), dev);
    if (it >= opt.warmup) {
      weight.push_back(weight_pass_ms(module, env, it, loss_id, dev));
      for (auto& p : module.parameters()) p.tensor.mutable_grad() = at::Tensor();
    }
    const double plain = time_ms(dev, [&] {
      TensorEnv plain_env = env;
      module.forward(plain_env, RunContext{it, it});
      at::Tensor loss = plain_env[loss_id];
      plain_env.clear();
      loss.backward();
    });
    for (auto& p : module.parameters()) p.tensor.mutable_grad() = at::Tensor();
    std::vector<uint64_t> node_seq(N);
    DeviceTimer fwd_timer(dev), bwd_timer(dev);
    synchronize(dev);
    module.forward(env, RunContext{it, it}, [&](int n) {
      node_seq[n] = at::sequence_number::peek();
      if (g.nodes[n].kind != OpKind::Input) fwd_timer.mark(n);  // inputs do nothing: charge nothing
    });
    fwd_timer.mark(-1);
    at::Tensor loss = env[loss_id];
    env.clear();
    hook_backward(loss.grad_fn(), node_seq, bwd_timer);
    // Engine start-up (it walks the graph to count dependencies) is charged to the loss node.
    bwd_timer.mark(loss_node);
    loss.backward();
    bwd_timer.mark(-1);
    loss = at::Tensor();
    if (it >= opt.warmup) {
      plain_ms += plain / opt.iterations;
      fwd.push_back(fwd_timer.totals_ms(N));
      bwd.push_back(bwd_timer.totals_ms(N));
    }
    for (auto& p : module.parameters()) p.tensor.mutable_grad() = at::Tensor();
  }
  InStepTiming t;
  mean_std(fwd, t.fwd_ms, t.fwd_ms_std);
  mean_std(bwd, t.bwd_ms, t.bwd_ms_std);
  std::vector<double> weight_std;
  mean_std(weight, t.weight_ms, weight_std);
  t.plain_fwd_bwd_ms = plain_ms;
  return t;
}

}  // namespace dawnpiper
