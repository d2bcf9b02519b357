#include "profile/profile_io.h"

#include <hdf5.h>

#include <cstring>
#include <ctime>
#include <stdexcept>
#include <vector>

#include "util/atomic_file.h"
#include "util/hdf5_io.h"
#include "util/hdf5_table.h"
#include "util/enum_names.h"
#include "util/error.h"
#include "util/field_list.h"

namespace dawnpiper {

using namespace h5;

namespace {

// A batch-size fit as two columns, <prefix>_base and <prefix>_per_sample.
template <typename Row>
void add_fit(std::vector<Column<Row>>& columns, const std::string& prefix, LinearFit Row::*fit, bool optional = false) {
  columns.push_back(column_of<Row>(
      prefix + "_base", [fit](const Row& r) { return (r.*fit).base; }, [fit](Row& r, double v) { (r.*fit).base = v; },
      optional));
  columns.push_back(column_of<Row>(
      prefix + "_per_sample", [fit](const Row& r) { return (r.*fit).per_sample; },
      [fit](Row& r, double v) { (r.*fit).per_sample = v; }, optional));
}

// Columns marked optional were added within schema 2: older files lack them and rows keep the
// defaults (no ties, no stage constants, no input copies, requires_grad and contiguity derived).
const std::vector<Column<NodeProfile>>& node_columns() {
  static const std::vector<Column<NodeProfile>> columns = [] {
    using N = NodeProfile;
    std::vector<Column<N>> c{member("name", &N::name),
                             member("kind", &N::kind),
                             member("block", &N::block),
                             member("depth", &N::depth),
                             member("fwd_ms", &N::fwd_ms),
                             member("fwd_ms_std", &N::fwd_ms_std),
                             member("bwd_ms", &N::bwd_ms),
                             member("bwd_ms_std", &N::bwd_ms_std),
                             member("recompute_ms", &N::recompute_ms),
                             member("param_bytes", &N::param_bytes),
                             member("param_grad_bytes", &N::param_grad_bytes),
                             member("tied_owner", &N::tied_owner, true),
                             member("tied_bytes", &N::tied_bytes, true),
                             member("constant_key", &N::constant_key, true),
                             member("constant_bytes", &N::constant_bytes, true),
                             member("fwd_workspace", &N::fwd_workspace),
                             member("bwd_workspace", &N::bwd_workspace),
                             member("bwd_input_workspace", &N::bwd_input_workspace, true),
                             member("passes_gradient", &N::passes_gradient, true),
                             member("workspace_full_at", &N::workspace_full_at, true),
                             member("weight_share", &N::weight_share, true)};
    add_fit(c, "fwd_ms", &N::fwd_ms_fit);
    add_fit(c, "bwd_ms", &N::bwd_ms_fit);
    add_fit(c, "fwd_workspace", &N::fwd_workspace_fit);
    add_fit(c, "bwd_workspace", &N::bwd_workspace_fit);
    add_fit(c, "bwd_input_workspace", &N::bwd_input_workspace_fit, true);
    return c;
  }();
  return columns;
}

const std::vector<Column<TensorProfile>>& tensor_columns() {
  static const std::vector<Column<TensorProfile>> columns = [] {
    using T = TensorProfile;
    std::vector<Column<T>> c{member("name", &T::name),
                             member("producer", &T::producer),
                             member("is_data", &T::is_data),
                             member("internal", &T::internal),
                             member("copy_of", &T::copy_of, true),
                             member("alias_of", &T::alias_of),
                             member("param_view", &T::param_view),
                             member("requires_grad", &T::requires_grad, true),
                             member("contiguous", &T::contiguous, true),
                             member("relaid_on_receipt", &T::relaid_on_receipt, true),
                             member("bytes", &T::bytes),
                             member("consumers", &T::consumers),
                             member("saved_by", &T::saved_by)};
    add_fit(c, "bytes", &T::bytes_fit);
    return c;
  }();
  return columns;
}

// The profile's attributes, declared once for writing and reading (kOptionalField: older files
// may lack it). Enums go by name, integers as int64, other numbers as double.
template <class P, class Field>
void profile_attributes(P& p, Field&& field) {
  field("model", p.model);
  field("preset", p.preset);
  field("graph_hash", p.graph_hash, kOptionalField);
  field("device", p.device);
  field("source", p.source);
  field("timing", p.timing);
  field("notes", p.notes, kOptionalField);  // schema 2
  field("precision", p.precision, kOptionalField);
  field("torch_version", p.torch_version);
  field("micro_batch_size", p.micro_batch_size);
  field("fit_max_rel_error", p.fit_max_rel_error);
  field("measured_step_ms", p.measured_step_ms);
  field("measured_fwd_bwd_ms", p.measured_fwd_bwd_ms);
  field("largest_param_bytes", p.largest_param_bytes);
  field("measured_peak_bytes", p.measured_peak_bytes);
  field("runtime_bytes", p.runtime_bytes, kOptionalField);  // older: 0
  field("update_ms_sgd", p.update_ms.sgd, kOptionalField);  // older: 0
  field("update_ms_adam", p.update_ms.adam, kOptionalField);
  field("update_ms_adamw", p.update_ms.adamw, kOptionalField);
}

struct AttributeWriter {
  hid_t file;
  template <class T>
  void operator()(const char* key, const T& value, bool /*optional*/ = false) const {
    if constexpr (has_enum_names<T>::value)
      write_attr(file, key, std::string(name_of(value)));
    else if constexpr (std::is_same_v<T, std::string>)
      write_attr(file, key, value);
    else if constexpr (std::is_integral_v<T>)
      write_attr<int64_t>(file, key, value);
    else
      write_attr<double>(file, key, value);
  }
};

struct AttributeReader {
  hid_t file;
  template <class T>
  void operator()(const char* key, T& value, bool optional = false) const {
    if (optional && !has_attr(file, key)) return;
    if constexpr (has_enum_names<T>::value)
      value = from_name<T>(read_attr_string(file, key));
    else if constexpr (std::is_same_v<T, std::string>)
      value = read_attr_string(file, key);
    else if constexpr (std::is_integral_v<T>)
      value = static_cast<T>(read_attr<int64_t>(file, key));
    else
      value = read_attr<double>(file, key);
  }
};

}  // namespace

void write_profile(const Profile& p, const std::string& path) {
  write_atomically(path, [&](const std::string& tmp) {
    Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose, "create " + path);
    write_attr(file, "format", std::string("dawnpiper-profile"));
    write_attr<int64_t>(file, "schema_version", Profile::kSchemaVersion);
    profile_attributes(p, AttributeWriter{file});
    write_attr(file, "created", p.created.empty() ? now_iso8601() : p.created);
    if (p.host_link.measured()) write_attr(file, "host_link", p.host_link.to_json());
    write_column(file, "profiled_batch_sizes", p.profiled_batch_sizes);
    write_strings(file, "blocks", p.blocks);

    Handle nodes(H5Gcreate2(file, "nodes", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose, "create group nodes");
    write_table(nodes, p.nodes, node_columns());
    Handle tensors(H5Gcreate2(file, "tensors", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose,
                   "create group tensors");
    write_table(tensors, p.tensors, tensor_columns());
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
    profile_attributes(p, AttributeReader{file});
    p.created = read_attr_string(file, "created");
    if (has_attr(file, "host_link")) p.host_link = HostLink::from_json(read_attr_string(file, "host_link"));
    p.profiled_batch_sizes = read_column<int64_t>(file, "profiled_batch_sizes");
    p.blocks = read_strings(file, "blocks");

    Handle nodes(H5Gopen2(file, "nodes", H5P_DEFAULT), H5Gclose, "open group nodes");
    p.nodes = read_table(nodes, node_columns());
    for (size_t k = 0; k < p.nodes.size(); ++k) p.nodes[k].id = static_cast<int>(k);
    Handle tensors(H5Gopen2(file, "tensors", H5P_DEFAULT), H5Gclose, "open group tensors");
    p.tensors = read_table(tensors, tensor_columns());
    for (size_t k = 0; k < p.tensors.size(); ++k) p.tensors[k].id = static_cast<int>(k);
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
