// The measured profiler: saved tensors captured from autograd, memory replay against the
// counting allocator's measured peak, batch-size fits, repeated-block sharing, HDF5 round trip.
#include "torch_test.h"

#include "chunked_preset.h"

#include <hdf5.h>

#include <cstdio>
#include <fstream>

#include "memory/counting_allocator.h"
#include "models/model_config.h"
#include "plan/stage_memory.h"
#include "profile/profile_io.h"
#include "profile/analytic.h"
#include "profile/measure_updates.h"
#include "profile/profiler.h"
#include "util/error.h"

using namespace dawnpiper;

namespace {
ProfilerOptions quick() {
  ProfilerOptions o;
  o.warmup = 1;
  o.iterations = 1;
  return o;
}

const NodeProfile& node(const Profile& p, const std::string& name) {
  for (const NodeProfile& n : p.nodes)
    if (n.name == name) return n;
  throw std::runtime_error("no node " + name);
}

bool saves(const Profile& p, const std::string& node_name, int tensor) {
  const auto& s = node(p, node_name).saved;
  return std::find(s.begin(), s.end(), tensor) != s.end();
}
}  // namespace

TEST_CASE("saved tensors are what autograd really keeps", "[profile]") {
  CountingAllocator::install();
  at::set_num_threads(1);
  OpGraph g = build_model(preset_config("gpt2-tiny"), 2);
  Profile p = profile_graph(g, quick());
  auto output_of = [&](const std::string& n) { return g.nodes[node(p, n).id].outputs[0]; };
  // linear saves its input; softmax saves its output; gelu saves its input; add saves nothing.
  CHECK(saves(p, "layer0.mlp.fc", output_of("layer0.ln2")));
  CHECK(saves(p, "layer0.attn.softmax", output_of("layer0.attn.softmax")));
  CHECK(saves(p, "layer0.mlp.gelu", output_of("layer0.mlp.fc")));
  CHECK(node(p, "layer0.attn_residual").saved.empty());
  // The embedding saves the token ids (data), not a float activation.
  CHECK(saves(p, "wte", output_of("tokens")));
  // Dropout keeps a one-byte-per-element mask as an internal buffer.
  const NodeProfile& drop = node(p, "layer0.attn.attn_drop");
  int64_t internal = 0;
  for (int t : drop.saved)
    if (p.tensors[t].internal) internal += p.tensors[t].bytes;
  CHECK(internal == g.tensor(output_of("layer0.attn.attn_drop")).bytes() / 4);
  // Views allocate nothing and what they save is recorded on the storage owner.
  const TensorProfile& heads = p.tensors[output_of("layer0.attn.q_heads")];
  CHECK(heads.alias_of >= 0);
  CHECK(heads.saved_by.empty());
  CHECK(p.tensors[output_of("wpe")].param_view);
}

TEST_CASE("replaying the profile predicts the measured step peak within 5%", "[profile]") {
  CountingAllocator::install();
  at::set_num_threads(1);
  // "preset/k": its output projection in k chunks (a tied weight read by k nodes, one gradient);
  // "preset@t": fused with the loss, t positions at a time (a chunk's logits as workspace);
  // "+attn": attention as one scaled_dot_product_attention call each.
  for (std::string preset : {"mlp-tiny", "gpt2-tiny", "bert-tiny", "t5-tiny", "amoebanet-tiny", "mlp-mini", "gpt2-mini",
                             "bert-mini", "t5-mini", "amoebanet-mini", "gpt2-mini/8", "bert-mini/8", "t5-tiny@48",
                             "gpt2-mini@96", "bert-mini@96", "t5-tiny+attn", "gpt2-mini@96+attn", "bert-mini+attn",
                             // peaks in an attention's backward (the softmax's gradient in place)
                             "gpt2-tiny@64 seq-len=64", "gpt2-tiny@64 seq-len=64 dropout=0", "bert-tiny@64 seq-len=64",
                             "t5-tiny@64 seq-len=64"}) {
    for (OptimizerKind optimizer : {OptimizerKind::Sgd, OptimizerKind::Adam}) {
      INFO(preset << " " << optimizer);
      const bool mini = preset.find("mini") != std::string::npos;
      OpGraph g = build_model(test::chunked_preset(preset), mini ? 2 : 4);
      Profile p = profile_graph(g, quick());
      StepMeasurement m = measure_step(g, optimizer, quick(), 1);
      const StageMemoryReplay r = replay_whole_step(p, optimizer);
      const double error = double(r.peak) / double(m.peak_bytes) - 1;
      WARN(preset << " " << optimizer << ": predicted " << r.peak << " measured " << m.peak_bytes << " (" << 100 * error
                  << "%)");
      CHECK(std::abs(error) < 0.05);
      if (mini) break;  // adam only for the tiny ones (time)
    }
  }
}

TEST_CASE("batch-size fits reproduce a direct profile's bytes", "[profile]") {
  CountingAllocator::install();
  ModelConfig c = preset_config("bert-tiny");
  Profile fitted = profile_model(c, {2, 4}, quick());
  CHECK(fitted.profiled_batch_sizes == std::vector<int64_t>{2, 4});
  Profile at6 = fitted.at_batch(6);
  OpGraph g6 = build_model(c, 6);
  for (const TensorInfo& t : g6.tensors) CHECK(at6.tensors[t.id].bytes == t.bytes());
  CHECK(at6.micro_batch_size == 6);
  CHECK_THROWS_AS(fitted.at_batch(0), ConfigError);
}

// At batch 1 a batched matmul copies no operand (the batch dimension folds away), from 2 on it
// does: the internal buffers differ between the profiled sizes. The fit matches them by what
// they are and keeps the larger sizes' copies, so a profile taken at micro-batch 1 still
// predicts larger ones (it predicted every tensor flat at its batch-1 size).
TEST_CASE("batch-size fits across a change of internal buffers", "[profile]") {
  CountingAllocator::install();
  ModelConfig c = preset_config("gpt2-tiny");
  auto copies = [](const Profile& p) {
    int n = 0;
    for (const TensorProfile& t : p.tensors) n += t.copy_of >= 0 && t.bytes > 0;
    return n;
  };
  auto total = [](const Profile& p) {
    int64_t sum = 0;
    for (const TensorProfile& t : p.tensors) sum += t.bytes;
    return sum;
  };
  const Profile at1 = profile_graph(build_model(c, 1), quick());
  const Profile direct = profile_graph(build_model(c, 6), quick());
  REQUIRE(copies(at1) == 0);
  REQUIRE(copies(direct) > 0);
  for (const Profile& fitted :
       {profile_model(c, {1, 2, 3}, quick()), analytic_profile_model(c, {1, 2}, device_spec("a100-40gb"))}) {
    INFO(name_of(fitted.source));
    CHECK(copies(fitted) == 0);  // at its own size, 1
    const Profile at6 = fitted.at_batch(6);
    CHECK(copies(at6) == copies(direct));
    CHECK(std::abs(double(total(at6)) / double(total(direct)) - 1) < 0.02);
  }
}

TEST_CASE("sharing repeated blocks keeps the memory structure", "[profile]") {
  CountingAllocator::install();
  ModelConfig c = preset_config("gpt2-tiny");
  c.layers = 3;
  OpGraph g = build_model(c, 2);
  ProfilerOptions shared = quick();
  shared.share_repeated_blocks = true;
  Profile full = profile_graph(g, quick()), reused = profile_graph(g, shared);
  REQUIRE(full.tensors.size() == reused.tensors.size());
  for (size_t t = 0; t < full.tensors.size(); ++t) {
    CHECK(full.tensors[t].saved_by == reused.tensors[t].saved_by);
    CHECK(full.tensors[t].bytes == reused.tensors[t].bytes);
  }
  CHECK(replay_whole_step(full, OptimizerKind::Sgd).peak == replay_whole_step(reused, OptimizerKind::Sgd).peak);
}

TEST_CASE("HDF5 profiles round-trip losslessly and refuse bad files", "[profile]") {
  CountingAllocator::install();
  Profile p = profile_model(preset_config("t5-tiny"), {2, 3}, quick());  // at 1 a matmul copies nothing
  CHECK(p.runtime_bytes == 0);                                           // the CPU's kernels keep nothing between calls
  p.runtime_bytes = 65 << 20;                                            // as an H200's cuBLAS workspaces
  p.measured_step_ms = 12.5;
  p.measured_peak_bytes = 123456;
  CHECK_FALSE(p.host_link.measured());  // the CPU has no link to measure
  p.host_link.samples = {{1 << 20, 17.2e9, 17.3e9, 23.9e9}, {64 << 20, 52.9e9, 51.8e9, 94.5e9}};  // an H100's
  const std::string path = "test_profile_roundtrip.h5";
  int constants = 0;  // T5's relative-position buckets: one per attention
  for (const NodeProfile& n : p.nodes) constants += n.constant_bytes > 0;
  CHECK(constants > 0);
  int copies = 0;  // attention matmuls copy their transposed value operand
  for (const TensorProfile& t : p.tensors)
    if (t.copy_of >= 0) {
      ++copies;
      CHECK(t.internal);
      const std::vector<int>& reads = p.tensors[static_cast<size_t>(t.copy_of)].consumers;
      CHECK(std::find(reads.begin(), reads.end(), t.producer) != reads.end());
    }
  CHECK(copies > 0);
  write_profile(p, path);
  Profile q = read_profile(path);
  CHECK(q.preset == p.preset);
  CHECK(q.model == p.model);
  CHECK(q.micro_batch_size == p.micro_batch_size);
  CHECK(q.profiled_batch_sizes == p.profiled_batch_sizes);
  CHECK(q.fit_max_rel_error == p.fit_max_rel_error);
  CHECK(q.measured_step_ms == p.measured_step_ms);
  CHECK(q.measured_peak_bytes == p.measured_peak_bytes);
  CHECK(q.runtime_bytes == p.runtime_bytes);
  CHECK(q.host_link.to_json() == p.host_link.to_json());
  CHECK(p.update_ms.adamw > 0);
  CHECK(q.update_ms.sgd == p.update_ms.sgd);
  CHECK(q.update_ms.adam == p.update_ms.adam);
  CHECK(q.update_ms.adamw == p.update_ms.adamw);
  CHECK(q.largest_param_bytes == p.largest_param_bytes);
  CHECK(q.blocks == p.blocks);
  REQUIRE(q.nodes.size() == p.nodes.size());
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const NodeProfile &a = p.nodes[i], &b = q.nodes[i];
    CHECK(a.name == b.name);
    CHECK(a.kind == b.kind);
    CHECK(a.fwd_ms == b.fwd_ms);
    CHECK(a.bwd_ms_fit.per_sample == b.bwd_ms_fit.per_sample);
    CHECK(a.param_grad_bytes == b.param_grad_bytes);
    CHECK(a.tied_owner == b.tied_owner);
    CHECK(a.tied_bytes == b.tied_bytes);
    CHECK(a.constant_key == b.constant_key);
    CHECK(a.constant_bytes == b.constant_bytes);
    CHECK(a.bwd_workspace == b.bwd_workspace);
    CHECK(a.bwd_input_workspace == b.bwd_input_workspace);
    CHECK(a.bwd_input_workspace_fit.base == b.bwd_input_workspace_fit.base);
    CHECK(a.outputs == b.outputs);
    CHECK(a.saved == b.saved);
  }
  REQUIRE(q.tensors.size() == p.tensors.size());
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    const TensorProfile &a = p.tensors[i], &b = q.tensors[i];
    CHECK(a.bytes == b.bytes);
    CHECK(a.bytes_fit.per_sample == b.bytes_fit.per_sample);
    CHECK(a.consumers == b.consumers);
    CHECK(a.saved_by == b.saved_by);
    CHECK(a.internal == b.internal);
    CHECK(a.copy_of == b.copy_of);
    CHECK(a.alias_of == b.alias_of);
    CHECK(a.param_view == b.param_view);
    CHECK(a.requires_grad == b.requires_grad);
    CHECK(a.contiguous == b.contiguous);
    CHECK(a.is_data == b.is_data);
    CHECK(a.name == b.name);
  }
  // A file from before a column was added reads with the column's default; a missing required
  // column is refused with the file's name.
  auto drop = [&](const char* dataset) {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(file >= 0);
    CHECK(H5Ldelete(file, dataset, H5P_DEFAULT) >= 0);
    H5Fclose(file);
  };
  drop("nodes/tied_owner");
  drop("tensors/contiguous");
  Profile older = read_profile(path);
  for (const NodeProfile& n : older.nodes) CHECK(n.tied_owner == -1);
  for (const TensorProfile& t : older.tensors) CHECK(t.contiguous == -1);
  CHECK(older.nodes.size() == p.nodes.size());
  drop("tensors/bytes");
  CHECK_THROWS_WITH(read_profile(path), Catch::Contains("is not a complete DawnPiper profile") &&
                                            Catch::Contains("bytes") && Catch::Contains(path));
  std::remove(path.c_str());
  // Not HDF5, missing, unwritable.
  { std::ofstream("not_a_profile.h5") << "hello"; }
  CHECK_THROWS_AS(read_profile("not_a_profile.h5"), ConfigError);
  std::remove("not_a_profile.h5");
  CHECK_THROWS_AS(read_profile("no_such_profile.h5"), ConfigError);
  CHECK_THROWS_AS(write_profile(p, "/no/such/dir/p.h5"), ConfigError);
}

TEST_CASE("in-step timing charges each node the time it takes inside a step", "[profile]") {
  CountingAllocator::install();
  at::set_num_threads(1);
  ModelConfig c = preset_config("mlp-tiny");
  set_integer_override(c, "hidden", 512);
  set_integer_override(c, "in-features", 512);
  const OpGraph g = build_model(c, 64);
  ProfilerOptions o = quick();
  o.iterations = 3;
  const Profile p = profile_graph(g, o);
  CHECK(p.timing == "in-step");
  double total = 0, linear = 0, loss_bwd = 0, bwd = 0;
  for (const NodeProfile& n : p.nodes) {
    if (n.kind == "input") {
      CHECK(n.fwd_ms == 0);
      CHECK(n.bwd_ms == 0);
      continue;
    }
    CHECK(n.fwd_ms > 0);
    CHECK(n.bwd_ms > 0);  // every node here creates autograd functions
    total += n.fwd_ms + n.bwd_ms;
    bwd += n.bwd_ms;
    if (n.kind == "linear") linear += n.fwd_ms + n.bwd_ms;
    if (n.name == "loss") loss_bwd = n.bwd_ms;
  }
  // 512x512 matrix products on 64 rows dominate ReLU and the 10-class loss; the backward pass
  // is spread over the nodes, not charged to the loss that starts it.
  CHECK(linear > 0.6 * total);
  CHECK(loss_bwd < 0.3 * bwd);
}

// A split backward's W (zero-bubble schedules) of each parameter reader, timed in a split step
// of the whole graph (GPT-2: its tied embedding feeds its output projection, which W then reaches
// through the whole model; the step keeps every saved tensor for it): a share of the node's
// backward, none for nodes without parameters.
TEST_CASE("in-step timing measures each parameter reader's weight-gradient share", "[profile]") {
  CountingAllocator::install();
  at::set_num_threads(1);
  const Profile p = profile_graph(build_model(preset_config("gpt2-tiny"), 2), quick());
  REQUIRE(p.timing == "in-step");
  int readers = 0;
  for (const NodeProfile& n : p.nodes) {
    INFO(n.name);
    if (n.param_bytes == 0 && n.tied_owner < 0) {
      CHECK(n.weight_share == 0);
      continue;
    }
    ++readers;
    CHECK(n.weight_share >= 0);
    CHECK(n.weight_share <= 1);
  }
  CHECK(readers > 10);
}

TEST_CASE("the optimizers' updates are timed, scaled to every parameter, and left out when they do not fit",
          "[profile]") {
  CountingAllocator& a = CountingAllocator::install();
  at::set_num_threads(1);
  const OpGraph g = build_model(preset_config("gpt2-tiny"), 2);
  const UpdateTimes all = measure_update_times(g, quick());
  CHECK(all.sgd > 0);
  CHECK(all.adam > 0);
  CHECK(all.adamw > 0);
  // The first parameter alone (gpt2-mini's token embedding, 2/5 of its parameters: large enough
  // that bytes, not launches, set the time) scaled to all of them: near the whole's time.
  // The best of three each: other work on the cores only lengthens a measurement.
  const OpGraph mini = build_model(preset_config("gpt2-mini"), 2);
  double whole = 1e30, scaled = 1e30;
  for (int round = 0; round < 3; ++round) {
    whole = std::min(whole, measure_update_times(mini, quick()).adamw);
    scaled = std::min(scaled, measure_update_times(mini, quick(), 1).adamw);
  }
  CHECK(scaled > 0.6 * whole);  // unscaled: 0.4 of it
  CHECK(scaled < 3 * whole);    // (the embedding alone runs 0.8-1.6x the whole's rate here)
  a.set_capacity(a.live_bytes() + 4096);
  UpdateTimes none;
  REQUIRE_NOTHROW(none = measure_update_times(g, quick()));
  a.set_capacity(kUnlimitedBytes);
  CHECK(none.of(OptimizerKind::AdamW) == 0);
  CHECK(none.of(OptimizerKind::Sgd) == 0);
  // A profile carries them (the first micro-batch size's) and the analytic one its roofline's.
  const Profile measured = profile_model(preset_config("gpt2-tiny"), {2, 3}, quick());
  CHECK(measured.update_ms.adamw > 0);
  const DeviceSpec a100 = device_spec("a100-40gb");
  const Profile analytic = analytic_profile(g, a100);
  CHECK(analytic.update_ms.adamw == Approx(1e3 * 4 * 23 * static_cast<double>(g.parameter_count()) / a100.bandwidth));
  CHECK(analytic.update_ms.sgd == Approx(analytic.update_ms.adamw * 12 / 23));
}

TEST_CASE("in-step timing falls back to isolated runs when the step does not fit", "[profile]") {
  CountingAllocator& a = CountingAllocator::install();
  at::set_num_threads(1);
  const OpGraph g = build_model(preset_config("gpt2-tiny"), 2);
  const int64_t step_peak = measure_step(g, OptimizerKind::Sgd, quick(), 1).peak_bytes;
  a.set_capacity(a.live_bytes() + step_peak / 2);
  Profile p;
  REQUIRE_NOTHROW(p = profile_graph(g, quick()));
  a.set_capacity(kUnlimitedBytes);
  CHECK(p.timing == "isolated");
  for (const NodeProfile& n : p.nodes)
    if (n.kind == "linear") CHECK(n.fwd_ms > 0);
}
