#include "runtime/pipeline_stage.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "data/scalar_type.h"
#include "graph/layout.h"
#include "train/grad_norm.h"
#include "util/error.h"

namespace dawnpiper {

namespace {
// The receiver allocates by the graph's shape and dtype: a mismatch would truncate the message.
void check_message_tensor(const at::Tensor& t, const TensorInfo& spec) {
  if (t.sizes().vec() != spec.shape || t.scalar_type() != scalar_type(spec.dtype))
    throw std::logic_error("tensor " + spec.name + " is " + shape_str(t.sizes().vec()) + " " +
                           c10::toString(t.scalar_type()) + ", the graph says " + shape_str(spec.shape) + " " +
                           dtype_name(spec.dtype));
}
}  // namespace

void check_grad_clip(const ScheduleChoice& schedule, double grad_clip) {
  if (!schedule.traits().updates_once_per_step && grad_clip > 0)
    throw ConfigError("--grad-clip clips the norm of one step's gradients over every stage; under --schedule " +
                      std::string(name_of(schedule)) +
                      " each stage updates after every backward, so there is none (use gpipe or 1f1b)");
}

PipelineStage::PipelineStage(const OpGraph& graph, const StageConfig& config, Transport& transport)
    : graph_(graph),
      config_(config),
      transport_(transport),
      module_(graph, config.program.begin, config.program.end, config.seed, config.device),
      data_(make_data_source(graph, config.data, config.seed, DataSplit::Train,
                             graph.micro_batch_size * config.micro_batches)) {
  const std::vector<bool> rg = graph.requires_grad();
  for (int t : module_.external_inputs())
    if (graph.is_data(t)) data_ids_.push_back(t);
  // Everything that crosses a cut travels over it, also tensors this stage only relays from an
  // earlier stage to a later one (skip connections over a whole stage); their gradients come
  // back the same way.
  for (const CrossingTensor& c : graph.crossing(config.program.begin)) {
    recv_ids_.push_back(c.tensor);
    recv_specs_.push_back(&graph.tensor(c.tensor));
    recv_requires_grad_.push_back(rg[c.tensor]);
    const std::vector<int>& readers = graph.tensor(c.tensor).consumers;
    recv_relayed_only_.push_back(std::none_of(
        readers.begin(), readers.end(), [&](int n) { return n >= config.program.begin && n < config.program.end; }));
  }
  // Gradients travel back only for tensors autograd tracks (not for masks, positions, ids).
  for (const CrossingTensor& c : graph.crossing(config.program.end)) {
    send_ids_.push_back(c.tensor);
    send_requires_grad_.push_back(rg[c.tensor]);
    if (rg[c.tensor]) grad_specs_.push_back(&graph.tensor(c.tensor));
  }
  for (auto& p : module_.parameters()) {
    masters_.push_back(p.tensor);
    counted_in_norm_.push_back(p.node >= config.program.begin && p.node < config.program.end);
  }
  last_grad_norm_ = std::numeric_limits<double>::quiet_NaN();
  check_grad_clip(config.schedule, config.optimizer.grad_clip);
  optimizer_ = make_optimizer(config.optimizer, masters_);
  auto evictor = std::make_unique<Evictor>(module_, config.program.evictions);
  if (evictor->active()) evictor_ = std::move(evictor);
  if (config.program.splits_backward()) split_ = std::make_unique<SplitBackward>(module_, config.program.stage);
}

int PipelineStage::weight_versions() const {
  return config_.schedule.traits().stashes_weights ? 1 + static_cast<int>(stash_.size()) : 1;
}

void PipelineStage::execute(const Action& a) {
  const auto where = [&] {
    return "stage " + std::to_string(config_.program.stage) +
           (config_.replicas > 1 ? " of replica " + std::to_string(config_.replica) : std::string()) + ", action " +
           to_string(a) + ": ";
  };
  try {
    run_action(a, *this);
  } catch (const Error& e) {
    throw Error(where() + e.what(), e.exit_code());
  } catch (const c10::OutOfMemoryError& e) {
    throw Error(where() + "out of memory: " + e.what_without_backtrace(), 3);
  } catch (const c10::Error& e) {
    throw Error(where() + "LibTorch: " + e.what_without_backtrace(), 5);
  } catch (const std::exception& e) {
    throw std::runtime_error(where() + e.what());
  }
}

void PipelineStage::runtime_action(const Action& a) {
  throw std::logic_error(std::string(name_of(a.kind)) + " runs inside the stage's own actions");
}

void PipelineStage::receive_activations(int64_t mb) {
  InFlight& f = in_flight_[mb];
  f.inputs = transport_.recv(config_.program.stage - 1, MessageKind::Activation, mb, recv_specs_);
  for (size_t i = 0; i < f.inputs.size(); ++i) {
    // An imported tensor that is a permuted view in the whole graph gets that layout back, so
    // the stage views and copies where the whole graph does (a reshape of a transposed
    // attention output views there; of a contiguous copy it would copy), and kernels that
    // lay out their outputs like their inputs do so as there (CPU attention: its output
    // follows the query's layout, a transposed slice of a fused projection).
    const TensorInfo& spec = *recv_specs_[i];
    const Strides layout = receipt_layout(spec.shape, spec.strides);
    if (!layout.empty()) {
      at::NoGradGuard no_grad;
      f.inputs[i] = at::empty_strided(spec.shape, layout, f.inputs[i].options()).copy_(f.inputs[i]);
    }
    if (recv_requires_grad_[i]) f.inputs[i].requires_grad_(true);
  }
}

void PipelineStage::send_activations(int64_t mb) {
  // Copies when the evictor empties sent storages next: the transport may still read them.
  // Contiguous ones, which the transport sends as they are.
  // Level 3: views of gathered parameters (a transposed weight the next stage reads) too, and
  // their buckets go once copied.
  const bool copy = evictor_ && evictor_->evicts_after_send();
  std::vector<at::Tensor> out, gathered_views;
  const std::vector<at::Tensor>& outputs = in_flight_.at(mb).outputs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor& t = outputs[i];
    check_message_tensor(t, graph_.tensor(send_ids_[i]));
    const bool views = zero_ && zero_->level() >= 3 && zero_->views_gathered(t);
    if (views) gathered_views.push_back(t);
    out.push_back(copy || views ? t.detach().clone(at::MemoryFormat::Contiguous) : t.detach());
  }
  transport_.send(config_.program.stage + 1, MessageKind::Activation, mb, std::move(out));
  if (!gathered_views.empty()) zero_->let_go_viewed(gathered_views);
  if (evictor_) evictor_->after_send(mb);
}

void PipelineStage::send_gradients(int64_t mb) {
  InFlight& f = in_flight_.at(mb);
  std::vector<at::Tensor> grads;
  for (size_t i = 0; i < f.inputs.size(); ++i) {
    if (!recv_requires_grad_[i]) continue;
    grads.push_back(f.inputs[i].grad().defined() ? f.inputs[i].grad() : at::zeros_like(f.inputs[i]));
    check_message_tensor(grads.back(), *recv_specs_[i]);
  }
  transport_.send(config_.program.stage - 1, MessageKind::Gradient, mb, std::move(grads));
  if (!f.weights_pending) {
    in_flight_.erase(mb);  // the micro-batch is done on this stage
  } else {
    // Autograd holds the tracked inputs until W (their gradients' accumulators do): not their
    // gradients, which the transport holds until the send completes.
    for (at::Tensor& input : f.inputs)
      if (input.requires_grad()) input.mutable_grad() = at::Tensor();
    f.inputs.clear();
    f.inputs_sent = true;
  }
}

void PipelineStage::receive_gradients(int64_t mb) {
  // Kept until Backward: stored as the outputs' pending gradients.
  InFlight& f = in_flight_.at(mb);
  std::vector<at::Tensor> grads = transport_.recv(config_.program.stage + 1, MessageKind::Gradient, mb, grad_specs_);
  // A gradient arrives contiguous. Autograd gives a gradient its tensor's layout (a
  // transposed attention output's), and the backward kernels expect that: given another,
  // they copy it while they run.
  for (size_t i = 0, g = 0; i < send_ids_.size(); ++i) {
    if (!send_requires_grad_[i]) continue;
    const at::Tensor& out = f.outputs[i];
    at::Tensor& grad = grads.at(g++);
    if (!out.is_contiguous() && out.is_non_overlapping_and_dense()) {
      at::NoGradGuard no_grad;
      grad = at::empty_like(out).copy_(grad);
    }
  }
  f.outputs.insert(f.outputs.end(), grads.begin(), grads.end());  // [outputs..., grads...]
}

std::vector<at::Tensor>& PipelineStage::version_tensors(int64_t version) {
  auto it = stash_.find(version);
  if (it != stash_.end()) return it->second;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> copy;
  for (const at::Tensor& m : masters_) copy.push_back(m.detach().clone().requires_grad_(true));
  return stash_[version] = std::move(copy);
}

void PipelineStage::forward(int64_t mb) {
  InFlight& f = in_flight_[mb];
  TensorEnv env = module_.make_env();
  data_->load(env, data_ids_, job_micro_batch(mb) * graph_.micro_batch_size, module_.device());
  for (size_t i = 0; i < recv_ids_.size(); ++i) env[recv_ids_[i]] = f.inputs.at(i);
  if (config_.schedule.traits().stashes_weights) {
    // This forward (and its backward) use the current weights, stashed until that backward.
    f.version = version_;
    auto& tensors = version_tensors(version_);
    ++stash_users_[version_];
    for (size_t i = 0; i < tensors.size(); ++i) module_.parameters()[i].tensor = tensors[i];
  }
  const RunContext ctx{step_of(mb), job_micro_batch(mb)};
  std::function<void(int)> before_node;
  std::function<void(int, TensorEnv&)> after_node;
  const bool gathers = zero_ && zero_->level() >= 3;
  if (evictor_) evictor_->begin_forward(mb, ctx, env);
  if (evictor_ || gathers)
    before_node = [&](int n) {
      if (gathers) zero_->before_forward_node(static_cast<size_t>(n - module_.begin()), env);
      if (evictor_) evictor_->before_node(mb, n);
    };
  if (evictor_ || split_ || gathers)
    after_node = [&](int n, TensorEnv& e) {
      if (split_) split_->record(n, e, f.weight_roots);
      if (evictor_) evictor_->after_node(mb, n, e);
      if (gathers) sharded_node_ran(n, e);
    };
  module_.forward(env, ctx, before_node, after_node);
  if (gathers) zero_->before_forward_node(static_cast<size_t>(module_.end() - module_.begin()), env);
  for (int t : send_ids_) f.outputs.push_back(env[t]);
  if (is_last()) {
    f.loss = env[graph_.nodes[graph_.loss_node()].outputs[0]];
    // Read with the step's other losses after its last backward: reading it here would make the
    // host wait for the device between every forward and its backward.
    step_losses_.push_back({mb, f.loss.detach()});
  }
}

void PipelineStage::sharded_node_ran(int n, TensorEnv& env) {
  if (!at::GradMode::is_enabled()) return;
  std::vector<at::Tensor> inputs;
  for (int t : graph_.nodes[n].inputs) inputs.push_back(env.at(static_cast<size_t>(t)));
  const std::vector<size_t> read = zero_->buckets_read(static_cast<size_t>(n - module_.begin()), inputs);
  if (read.empty()) return;
  // Its backward gathers them again before its functions run: they follow the output
  // gradients' arrival.
  ZeroShard* zero = zero_.get();
  const size_t node = static_cast<size_t>(n - module_.begin());
  for (int t : graph_.nodes[n].outputs) {
    const at::Tensor& out = env.at(static_cast<size_t>(t));
    if (out.defined() && out.requires_grad() && !out.is_leaf())
      out.register_hook([zero, read, node](const at::TensorBase&) { zero->before_backward_node(node, read); });
  }
  // A split backward's input pass lets them go once the node's functions ran: where the gradient
  // of an input it computed from is complete.
  if (!split_) return;
  for (const at::Tensor& in : inputs)
    if (in.defined() && in.requires_grad() && !in.is_leaf())
      in.register_hook([zero, read, node](const at::TensorBase&) { zero->inputs_gradient_made(node, read); });
}

void PipelineStage::backward_roots(InFlight& f, std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& grads) {
  if (is_last()) {
    // Synchronous schedules accumulate the mean over the step's micro-batches, as the
    // reference trainer does; PipeDream's asynchronous updates use each micro-batch's loss.
    const double scale = config_.schedule.traits().loss_scale(config_.micro_batches);
    outputs.push_back(f.loss * scale);
    grads.push_back(at::ones_like(outputs.back()));
    return;
  }
  const size_t n = send_ids_.size();
  for (size_t i = 0, g = 0; i < n; ++i) {
    if (!send_requires_grad_[i]) continue;
    // f.outputs: [outputs..., the received gradients of the tracked ones...]
    if (f.outputs[i].requires_grad()) outputs.push_back(f.outputs[i]), grads.push_back(f.outputs.at(n + g));
    ++g;
  }
}

void PipelineStage::backward(int64_t mb) {
  InFlight& f = in_flight_.at(mb);
  if (evictor_ && config_.schedule.traits().stashes_weights) {
    // Recomputation must see the weights this micro-batch's forward used.
    auto& tensors = stash_.at(f.version);
    for (size_t i = 0; i < tensors.size(); ++i) module_.parameters()[i].tensor = tensors[i];
  }
  {
    std::vector<at::Tensor> outputs, grads;
    backward_roots(f, outputs, grads);
    // A received tensor only relayed on gets the received gradient itself: its accumulator
    // would copy it (the pending gradients hold it too), one copy the replay does not count.
    auto relayed_only = [&](const at::Tensor& t) {
      for (size_t j = 0; j < f.inputs.size(); ++j)
        if (recv_relayed_only_[j] && f.inputs[j].unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return true;
      return false;
    };
    for (size_t k = outputs.size(); k-- > 0;) {
      if (outputs[k].grad_fn() || outputs[k].grad().defined() || !relayed_only(outputs[k])) continue;
      outputs[k].mutable_grad() = std::move(grads[k]);
      outputs.erase(outputs.begin() + static_cast<std::ptrdiff_t>(k));
      grads.erase(grads.begin() + static_cast<std::ptrdiff_t>(k));
    }
    if (evictor_) evictor_->before_backward(mb, outputs);
    weight_pass_begins();
    if (!outputs.empty()) torch::autograd::backward(outputs, grads);
  }
  f.loss = at::Tensor();
  if (evictor_) evictor_->after_backward(mb);
  latest_step_ = step_of(mb);
  f.outputs.clear();
  if (config_.schedule.traits().stashes_weights) {
    // Move the stashed version's gradients to the masters for the update that follows.
    auto& tensors = stash_.at(f.version);
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].grad().defined()) masters_[i].mutable_grad() = tensors[i].grad();
      tensors[i].mutable_grad() = at::Tensor();
    }
    // The module shows the current weights again (and keeps no stashed version alive).
    for (size_t i = 0; i < masters_.size(); ++i) module_.parameters()[i].tensor = masters_[i];
    if (--stash_users_[f.version] == 0) {
      stash_.erase(f.version);
      stash_users_.erase(f.version);
    }
  }
  if (config_.program.stage == 0) in_flight_.erase(mb);  // no gradient to send upstream
  weight_pass_done();
  count_loss(mb);
}

void PipelineStage::weight_pass_begins() {
  const bool last = config_.schedule.traits().updates_once_per_step && !replicas_averaged_ &&
                    weight_passes_ + 1 == config_.micro_batches;
  if (zero_) zero_->begin_pass(last);  // level 1 streams in the step's last
  if (begin_replica_pass_) begin_replica_pass_(last);
}

void PipelineStage::weight_pass_done() {
  if (zero_) zero_->end_micro_batch();  // where it streamed: this pass's buckets are under way
  if (!config_.schedule.traits().updates_once_per_step || ++weight_passes_ < config_.micro_batches) return;
  weight_passes_ = 0;
  if (start_replicas_ && !replicas_averaged_) start_replicas_(module_.parameters());
}

void PipelineStage::backward_input(int64_t mb) {
  if (!split_) throw std::logic_error("an I action on a stage not set up to split its backward");
  InFlight& f = in_flight_.at(mb);
  std::vector<at::Tensor> outputs, grads, inputs;
  backward_roots(f, outputs, grads);
  if (evictor_) evictor_->before_backward(mb, outputs);
  std::vector<size_t> tracked;  // received inputs autograd tracks
  for (size_t i = 0; i < f.inputs.size(); ++i)
    if (recv_requires_grad_[i] && f.inputs[i].requires_grad()) tracked.push_back(i), inputs.push_back(f.inputs[i]);
  // ZeRO level 3: the input pass gathers what its nodes read and lets it go as they run; the
  // weight pass gathers node by node again (the hooks on their outputs run before their functions).
  if (zero_) zero_->begin_input_pass();
  if (!outputs.empty()) {
    std::vector<at::Tensor> got = split_->input_pass(outputs, grads, inputs, f.weight_roots);
    for (size_t k = 0; k < tracked.size(); ++k) f.inputs[tracked[k]].mutable_grad() = std::move(got[k]);
  }
  if (zero_) zero_->end_input_pass();
  // The outputs (and the loss) keep the graph until W; the received gradients are done with,
  // but for what the weight pass holds of them.
  f.outputs.resize(send_ids_.size());
  f.weights_pending = true;
  latest_step_ = step_of(mb);
  count_loss(mb);
}

void PipelineStage::backward_weight(int64_t mb) {
  InFlight& f = in_flight_.at(mb);
  weight_pass_begins();
  split_->weight_pass(f.weight_roots);
  if (evictor_) evictor_->after_backward(mb);
  weight_pass_done();
  if (config_.program.stage == 0 || f.inputs_sent) {
    in_flight_.erase(mb);  // the graph goes with the outputs
    return;
  }
  f.weights_pending = false;  // the gradients are sent next
  f.outputs.clear();
  f.loss = at::Tensor();
}

void PipelineStage::count_loss(int64_t mb) {
  if (!is_last() || static_cast<int64_t>(step_losses_.size()) != config_.micro_batches) return;
  std::vector<at::Tensor> losses;
  for (const auto& [id, loss] : step_losses_) losses.push_back(loss);
  const at::Tensor values = at::stack(losses).to(at::kCPU, at::kDouble);  // one wait for the device
  const double* value = values.const_data_ptr<double>();
  double sum = 0;
  for (size_t i = 0; i < step_losses_.size(); ++i) {
    const int64_t id = step_losses_[i].first;
    if (!std::isfinite(value[i]))
      throw Error("loss is " + std::to_string(value[i]) + " at step " + std::to_string(step_of(id)) + ", micro-batch " +
                  std::to_string(id) + "; lower --lr");
    sum += value[i];
  }
  step_losses_.clear();
  if (on_loss_) on_loss_(step_of(mb), sum / static_cast<double>(config_.micro_batches));
}

double PipelineStage::evaluate(int64_t id, int64_t index) {
  at::NoGradGuard no_grad;
  if (!validation_)
    validation_ = make_data_source(graph_, config_.data, config_.seed, DataSplit::Validation, graph_.micro_batch_size);
  TensorEnv env = module_.make_env();
  validation_->load(env, data_ids_, index * graph_.micro_batch_size, module_.device());
  if (config_.program.stage > 0) {
    std::vector<at::Tensor> in = transport_.recv(config_.program.stage - 1, MessageKind::Activation, id, recv_specs_);
    for (size_t i = 0; i < recv_ids_.size(); ++i) env[recv_ids_[i]] = in[i];
  }
  RunContext ctx{-1, id};
  ctx.eval = true;
  if (zero_ && zero_->level() >= 3) {
    module_.forward(env, ctx,
                    [&](int n) { zero_->before_forward_node(static_cast<size_t>(n - module_.begin()), env); });
    zero_->before_forward_node(static_cast<size_t>(module_.end() - module_.begin()), env);
  } else {
    module_.forward(env, ctx);
  }
  if (is_last()) return env[graph_.nodes[graph_.loss_node()].outputs[0]].item<double>();
  std::vector<at::Tensor> out;
  for (int t : send_ids_) out.push_back(env[t]);
  transport_.send(config_.program.stage + 1, MessageKind::Activation, id, std::move(out));
  return 0;
}

double PipelineStage::grad_square_sum() const {
  if (zero_) return zero_->grad_square_sum();  // collective over the replicas
  return dawnpiper::grad_square_sum(masters_, counted_in_norm_);
}

void PipelineStage::shard_optimizer(MPI_Comm replicas, int64_t bucket_bytes, int level, std::vector<bool> deferred) {
  if (const std::string refusal = zero_refusal(level, config_.schedule); !refusal.empty())
    throw std::logic_error(refusal);
  module_.set_parameter_gate({});
  zero_.reset();  // (its hooks go first)
  std::vector<int> nodes;
  for (const StageParameter& p : module_.parameters()) nodes.push_back(p.node);
  std::vector<std::vector<int>> reads;
  if (level >= 3)
    for (int n = module_.begin(); n < module_.end(); ++n) reads.push_back(module_.parameters_read(n));
  // Gathered in the compute precision (the parameters are cast to it at each use).
  zero_ = std::make_unique<ZeroShard>(masters_, counted_in_norm_, replicas, bucket_bytes, level, std::move(deferred),
                                      nodes, reads, graph_.precision == Precision::Bf16 ? at::kBFloat16 : at::kFloat);
  optimizer_ = make_optimizer(config_.optimizer, zero_->pieces());
  if (level >= 3)
    module_.set_parameter_gate([zero = zero_.get()](int param) { zero->gather_param(static_cast<size_t>(param)); });
}

void PipelineStage::average_replicas() {
  if (replicas_averaged_ || !reduce_replicas_) return;
  reduce_replicas_(module_.parameters());
  replicas_averaged_ = true;
}

void PipelineStage::optimizer_step() {
  average_replicas();
  if (config_.schedule.traits().updates_once_per_step) {
    // The reducer sums every stage's squares (it computes this stage's too).
    last_grad_norm_ = std::sqrt(reduce_norm_ ? reduce_norm_() : grad_square_sum());
    if (config_.optimizer.grad_clip > 0)
      clip_grads(zero_ ? zero_->pieces() : masters_, last_grad_norm_, config_.optimizer.grad_clip);
  }
  optimizer_->set_lr(scheduled_lr(config_.optimizer.lr, config_.optimizer.schedule, latest_step_));
  optimizer_->step();
  if (zero_) zero_->all_gather();
  ++version_;
  replicas_averaged_ = false;
}

}  // namespace dawnpiper
