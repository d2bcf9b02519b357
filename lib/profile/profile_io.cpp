#include "profile/profile_io.h"

#include <hdf5.h>

#include <cstring>
#include <ctime>
#include <stdexcept>
#include <vector>

#include "util/atomic_file.h"
#include "util/hdf5_io.h"
#include "util/error.h"

namespace dawnpiper {

namespace {

using namespace h5;

}  // namespace

void write_profile(const Profile& p, const std::string& path) {
  write_atomically(path, [&](const std::string& tmp) {
    Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose, "create " + path);
    write_attr(file, "format", std::string("dawnpiper-profile"));
    write_attr<int64_t>(file, "schema_version", Profile::kSchemaVersion);
    write_attr(file, "model", p.model);
    write_attr(file, "preset", p.preset);
    write_attr(file, "graph_hash", p.graph_hash);
    write_attr(file, "device", p.device);
    write_attr(file, "source", p.source);
    write_attr(file, "timing", p.timing);
    write_attr(file, "notes", p.notes);
    write_attr(file, "precision", p.precision);
    write_attr(file, "torch_version", p.torch_version);
    write_attr(file, "created", p.created.empty() ? now_iso8601() : p.created);
    write_attr<int64_t>(file, "micro_batch_size", p.micro_batch_size);
    write_attr<double>(file, "fit_max_rel_error", p.fit_max_rel_error);
    write_attr<double>(file, "measured_step_ms", p.measured_step_ms);
    write_attr<double>(file, "measured_fwd_bwd_ms", p.measured_fwd_bwd_ms);
    write_attr<int64_t>(file, "largest_param_bytes", p.largest_param_bytes);
    write_attr<int64_t>(file, "measured_peak_bytes", p.measured_peak_bytes);
    write_column(file, "profiled_batch_sizes", p.profiled_batch_sizes);
    write_strings(file, "blocks", p.blocks);

    Handle nodes(H5Gcreate2(file, "nodes", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose, "create group nodes");
    const auto& N = p.nodes;
    write_strings(nodes, "name", column(N, [](const NodeProfile& n) { return n.name; }));
    write_strings(nodes, "kind", column(N, [](const NodeProfile& n) { return n.kind; }));
    write_column<int64_t>(nodes, "block", column(N, [](const NodeProfile& n) { return int64_t(n.block); }));
    write_column<int64_t>(nodes, "depth", column(N, [](const NodeProfile& n) { return int64_t(n.depth); }));
    write_column<double>(nodes, "fwd_ms", column(N, [](const NodeProfile& n) { return n.fwd_ms; }));
    write_column<double>(nodes, "fwd_ms_std", column(N, [](const NodeProfile& n) { return n.fwd_ms_std; }));
    write_column<double>(nodes, "bwd_ms", column(N, [](const NodeProfile& n) { return n.bwd_ms; }));
    write_column<double>(nodes, "bwd_ms_std", column(N, [](const NodeProfile& n) { return n.bwd_ms_std; }));
    write_column<double>(nodes, "recompute_ms", column(N, [](const NodeProfile& n) { return n.recompute_ms; }));
    write_column<double>(nodes, "fwd_ms_base", column(N, [](const NodeProfile& n) { return n.fwd_ms_fit.base; }));
    write_column<double>(nodes, "fwd_ms_per_sample",
                         column(N, [](const NodeProfile& n) { return n.fwd_ms_fit.per_sample; }));
    write_column<double>(nodes, "bwd_ms_base", column(N, [](const NodeProfile& n) { return n.bwd_ms_fit.base; }));
    write_column<double>(nodes, "bwd_ms_per_sample",
                         column(N, [](const NodeProfile& n) { return n.bwd_ms_fit.per_sample; }));
    write_column<int64_t>(nodes, "param_bytes", column(N, [](const NodeProfile& n) { return n.param_bytes; }));
    write_column<int64_t>(nodes, "param_grad_bytes",
                          column(N, [](const NodeProfile& n) { return n.param_grad_bytes; }));
    write_column<int64_t>(nodes, "tied_owner", column(N, [](const NodeProfile& n) { return int64_t{n.tied_owner}; }));
    write_column<int64_t>(nodes, "tied_bytes", column(N, [](const NodeProfile& n) { return n.tied_bytes; }));
    write_strings(nodes, "constant_key", column(N, [](const NodeProfile& n) { return n.constant_key; }));
    write_column<int64_t>(nodes, "constant_bytes", column(N, [](const NodeProfile& n) { return n.constant_bytes; }));
    write_column<int64_t>(nodes, "fwd_workspace", column(N, [](const NodeProfile& n) { return n.fwd_workspace; }));
    write_column<int64_t>(nodes, "bwd_workspace", column(N, [](const NodeProfile& n) { return n.bwd_workspace; }));
    write_column<double>(nodes, "fwd_workspace_base",
                         column(N, [](const NodeProfile& n) { return n.fwd_workspace_fit.base; }));
    write_column<double>(nodes, "fwd_workspace_per_sample",
                         column(N, [](const NodeProfile& n) { return n.fwd_workspace_fit.per_sample; }));
    write_column<double>(nodes, "bwd_workspace_base",
                         column(N, [](const NodeProfile& n) { return n.bwd_workspace_fit.base; }));
    write_column<double>(nodes, "bwd_workspace_per_sample",
                         column(N, [](const NodeProfile& n) { return n.bwd_workspace_fit.per_sample; }));

    Handle tensors(H5Gcreate2(file, "tensors", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose,
                   "create group tensors");
    const auto& T = p.tensors;
    write_strings(tensors, "name", column(T, [](const TensorProfile& t) { return t.name; }));
    write_column<int64_t>(tensors, "producer", column(T, [](const TensorProfile& t) { return int64_t(t.producer); }));
    write_column<int64_t>(tensors, "is_data", column(T, [](const TensorProfile& t) { return int64_t(t.is_data); }));
    write_column<int64_t>(tensors, "internal", column(T, [](const TensorProfile& t) { return int64_t(t.internal); }));
    write_column<int64_t>(tensors, "copy_of", column(T, [](const TensorProfile& t) { return int64_t(t.copy_of); }));
    write_column<int64_t>(tensors, "alias_of", column(T, [](const TensorProfile& t) { return int64_t(t.alias_of); }));
    write_column<int64_t>(tensors, "param_view",
                          column(T, [](const TensorProfile& t) { return int64_t(t.param_view); }));
    write_column<int64_t>(tensors, "requires_grad",
                          column(T, [](const TensorProfile& t) { return int64_t(t.requires_grad); }));
    write_column<int64_t>(tensors, "contiguous",
                          column(T, [](const TensorProfile& t) { return int64_t(t.contiguous); }));
    write_column<int64_t>(tensors, "bytes", column(T, [](const TensorProfile& t) { return t.bytes; }));
    write_column<double>(tensors, "bytes_base", column(T, [](const TensorProfile& t) { return t.bytes_fit.base; }));
    write_column<double>(tensors, "bytes_per_sample",
                         column(T, [](const TensorProfile& t) { return t.bytes_fit.per_sample; }));
    write_lists(tensors, "consumers", column(T, [](const TensorProfile& t) { return t.consumers; }));
    write_lists(tensors, "saved_by", column(T, [](const TensorProfile& t) { return t.saved_by; }));
  });
}

Profile read_profile(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors become our messages, not HDF5's dumps
  if (H5Fis_hdf5(path.c_str()) <= 0)
    throw ConfigError("'" + path + "' is not a readable HDF5 profile (make one with `dawnpiper profile --out`)");
  Profile p;
  try {
    Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, "open " + path);
    if (read_attr_string(file, "format") != "dawnpiper-profile")
      throw ConfigError("'" + path + "' is an HDF5 file but not a DawnPiper profile");
    const int64_t version = read_attr<int64_t>(file, "schema_version");
    if (version != Profile::kSchemaVersion)
      throw ConfigError("'" + path + "' has profile schema version " + std::to_string(version) +
                        "; this build reads version " + std::to_string(Profile::kSchemaVersion) + " (re-profile)");
    p.model = read_attr_string(file, "model");
    p.preset = read_attr_string(file, "preset");
    if (has_attr(file, "graph_hash")) p.graph_hash = read_attr_string(file, "graph_hash");
    p.device = read_attr_string(file, "device");
    p.source = read_attr_string(file, "source");
    p.timing = read_attr_string(file, "timing");
    if (has_attr(file, "notes")) p.notes = read_attr_string(file, "notes");  // optional in schema 2
    if (has_attr(file, "precision")) p.precision = read_attr_string(file, "precision");
    p.torch_version = read_attr_string(file, "torch_version");
    p.created = read_attr_string(file, "created");
    p.micro_batch_size = read_attr<int64_t>(file, "micro_batch_size");
    p.fit_max_rel_error = read_attr<double>(file, "fit_max_rel_error");
    p.measured_step_ms = read_attr<double>(file, "measured_step_ms");
    p.measured_fwd_bwd_ms = read_attr<double>(file, "measured_fwd_bwd_ms");
    p.largest_param_bytes = read_attr<int64_t>(file, "largest_param_bytes");
    p.measured_peak_bytes = read_attr<int64_t>(file, "measured_peak_bytes");
    p.profiled_batch_sizes = read_column<int64_t>(file, "profiled_batch_sizes");
    p.blocks = read_strings(file, "blocks");

    Handle nodes(H5Gopen2(file, "nodes", H5P_DEFAULT), H5Gclose, "open group nodes");
    auto name = read_strings(nodes, "name");
    auto kind = read_strings(nodes, "kind");
    auto block = read_column<int64_t>(nodes, "block");
    auto depth = read_column<int64_t>(nodes, "depth");
    auto d = [&](const char* c) { return read_column<double>(nodes, c); };
    auto i = [&](const char* c) { return read_column<int64_t>(nodes, c); };
    auto fwd = d("fwd_ms"), fwd_std = d("fwd_ms_std"), bwd = d("bwd_ms"), bwd_std = d("bwd_ms_std"),
         rec = d("recompute_ms"), fb = d("fwd_ms_base"), fs = d("fwd_ms_per_sample"), bb = d("bwd_ms_base"),
         bs = d("bwd_ms_per_sample"), fwb = d("fwd_workspace_base"), fws = d("fwd_workspace_per_sample"),
         bwb = d("bwd_workspace_base"), bws = d("bwd_workspace_per_sample");
    auto pb = i("param_bytes"), pgb = i("param_grad_bytes"), fw = i("fwd_workspace"), bw = i("bwd_workspace");
    // Added within schema 2: profiles written before have no ties recorded.
    const bool ties = H5Lexists(nodes, "tied_owner", H5P_DEFAULT) > 0;
    std::vector<int64_t> to = ties ? i("tied_owner") : std::vector<int64_t>(name.size(), -1),
                         tb = ties ? i("tied_bytes") : std::vector<int64_t>(name.size(), 0);
    // Likewise: profiles written before have no stage constants recorded.
    const bool constants = H5Lexists(nodes, "constant_key", H5P_DEFAULT) > 0;
    std::vector<std::string> ck =
        constants ? read_strings(nodes, "constant_key") : std::vector<std::string>(name.size());
    std::vector<int64_t> cb = constants ? i("constant_bytes") : std::vector<int64_t>(name.size(), 0);
    for (size_t k = 0; k < name.size(); ++k) {
      NodeProfile n;
      n.id = static_cast<int>(k);
      n.name = name[k];
      n.kind = kind[k];
      n.block = static_cast<int>(block[k]);
      n.depth = static_cast<int>(depth[k]);
      n.fwd_ms = fwd[k], n.fwd_ms_std = fwd_std[k], n.bwd_ms = bwd[k], n.bwd_ms_std = bwd_std[k];
      n.recompute_ms = rec[k];
      n.fwd_ms_fit = {fb[k], fs[k]};
      n.bwd_ms_fit = {bb[k], bs[k]};
      n.param_bytes = pb[k];
      n.param_grad_bytes = pgb[k];
      n.tied_owner = static_cast<int>(to[k]);
      n.tied_bytes = tb[k];
      n.constant_key = ck[k];
      n.constant_bytes = cb[k];
      n.fwd_workspace = fw[k];
      n.bwd_workspace = bw[k];
      n.fwd_workspace_fit = {fwb[k], fws[k]};
      n.bwd_workspace_fit = {bwb[k], bws[k]};
      p.nodes.push_back(n);
    }
    Handle tensors(H5Gopen2(file, "tensors", H5P_DEFAULT), H5Gclose, "open group tensors");
    auto tname = read_strings(tensors, "name");
    auto producer = read_column<int64_t>(tensors, "producer");
    auto is_data = read_column<int64_t>(tensors, "is_data");
    auto internal = read_column<int64_t>(tensors, "internal");
    // Added within schema 2: profiles written before record no input copies.
    const std::vector<int64_t> copy_of = H5Lexists(tensors, "copy_of", H5P_DEFAULT) > 0
                                             ? read_column<int64_t>(tensors, "copy_of")
                                             : std::vector<int64_t>(tname.size(), -1);
    // Added within schema 2 too: -1 (the replays derive it) in older files.
    const std::vector<int64_t> requires_grad = H5Lexists(tensors, "requires_grad", H5P_DEFAULT) > 0
                                                   ? read_column<int64_t>(tensors, "requires_grad")
                                                   : std::vector<int64_t>(tname.size(), -1);
    const std::vector<int64_t> contiguous = H5Lexists(tensors, "contiguous", H5P_DEFAULT) > 0
                                                ? read_column<int64_t>(tensors, "contiguous")
                                                : std::vector<int64_t>(tname.size(), -1);
    auto alias = read_column<int64_t>(tensors, "alias_of");
    auto param_view = read_column<int64_t>(tensors, "param_view");
    auto bytes = read_column<int64_t>(tensors, "bytes");
    auto bb2 = read_column<double>(tensors, "bytes_base");
    auto bs2 = read_column<double>(tensors, "bytes_per_sample");
    auto consumers = read_lists(tensors, "consumers");
    auto saved_by = read_lists(tensors, "saved_by");
    for (size_t k = 0; k < tname.size(); ++k) {
      TensorProfile t;
      t.id = static_cast<int>(k);
      t.name = tname[k];
      t.producer = static_cast<int>(producer[k]);
      t.is_data = is_data[k] != 0;
      t.internal = internal[k] != 0;
      t.copy_of = static_cast<int>(copy_of[k]);
      t.alias_of = static_cast<int>(alias[k]);
      t.param_view = param_view[k] != 0;
      t.requires_grad = static_cast<int>(requires_grad[k]);
      t.contiguous = static_cast<int>(contiguous[k]);
      t.bytes = bytes[k];
      t.bytes_fit = {bb2[k], bs2[k]};
      t.consumers = consumers[k];
      t.saved_by = saved_by[k];
      p.tensors.push_back(t);
    }
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const Error*>(&e)) throw;
    throw ConfigError("'" + path + "' is not a complete DawnPiper profile (" + e.what() + ")");
  }
  // Derived lists: a node's outputs and what its backward saved.
  for (const TensorProfile& t : p.tensors) {
    if (t.producer >= 0 && t.producer < p.size()) p.nodes[t.producer].outputs.push_back(t.id);
    for (int s : t.saved_by) p.nodes.at(s).saved.push_back(t.id);
  }
  return p;
}

}  // namespace dawnpiper
