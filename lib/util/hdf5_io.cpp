#include "util/hdf5_io.h"

#include <ctime>

namespace dawnpiper::h5 {

void check(herr_t status, const std::string& what) {
  if (status < 0) throw std::runtime_error("HDF5: cannot " + what);
}

namespace {
Handle string_type() {
  Handle t(H5Tcopy(H5T_C_S1), H5Tclose, "copy string type");
  check(H5Tset_size(t, H5T_VARIABLE), "set string size");
  check(H5Tset_cset(t, H5T_CSET_UTF8), "set string charset");
  return Handle(H5Tcopy(t), H5Tclose, "copy string type");
}
}  // namespace

void write_floats(hid_t group, const std::string& name, const float* data, size_t count) {
  hsize_t dims[1] = {count};
  Handle space(H5Screate_simple(1, dims, nullptr), H5Sclose, "create dataspace");
  Handle set(H5Dcreate2(group, name.c_str(), H5T_NATIVE_FLOAT, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose,
             "create dataset " + name);
  if (count) check(H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "write " + name);
}

void read_floats(hid_t group, const std::string& name, float* data, size_t count) {
  Handle set(H5Dopen2(group, name.c_str(), H5P_DEFAULT), H5Dclose, "open dataset " + name);
  Handle space(H5Dget_space(set), H5Sclose, "get dataspace");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  if (n != count)
    throw std::runtime_error("dataset " + name + " has " + std::to_string(n) + " values, expected " +
                             std::to_string(count));
  if (n) check(H5Dread(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "read " + name);
}

void read_float_range(hid_t group, const std::string& name, int64_t total, int64_t offset, float* data, int64_t count) {
  Handle set(H5Dopen2(group, name.c_str(), H5P_DEFAULT), H5Dclose, "open dataset " + name);
  Handle space(H5Dget_space(set), H5Sclose, "get dataspace");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  if (static_cast<int64_t>(n) != total || offset < 0 || count < 0 || offset + count > total)
    throw std::runtime_error("dataset " + name + " has " + std::to_string(n) + " values, expected " +
                             std::to_string(total));
  if (count == 0) return;
  const hsize_t start[1] = {static_cast<hsize_t>(offset)}, length[1] = {static_cast<hsize_t>(count)};
  check(H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, length, nullptr), "select in " + name);
  Handle memory(H5Screate_simple(1, length, nullptr), H5Sclose, "create dataspace");
  check(H5Dread(set, H5T_NATIVE_FLOAT, memory, space, H5P_DEFAULT, data), "read " + name);
}

void write_strings(hid_t group, const std::string& name, const std::vector<std::string>& values) {
  std::vector<const char*> ptrs;
  for (const auto& v : values) ptrs.push_back(v.c_str());
  hsize_t dims[1] = {values.size()};
  Handle type = string_type();
  Handle space(H5Screate_simple(1, dims, nullptr), H5Sclose, "create dataspace");
  Handle set(H5Dcreate2(group, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose,
             "create dataset " + name);
  if (!ptrs.empty()) check(H5Dwrite(set, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()), "write " + name);
}

void write_lists(hid_t group, const std::string& name, const std::vector<std::vector<int>>& lists) {
  std::vector<int64_t> values, offsets{0};
  for (const auto& l : lists) {
    values.insert(values.end(), l.begin(), l.end());
    offsets.push_back(static_cast<int64_t>(values.size()));
  }
  write_column(group, name, values);
  write_column(group, name + "_offsets", offsets);
}

void write_attr(hid_t obj, const std::string& name, const std::string& value) {
  Handle type = string_type();
  Handle space(H5Screate(H5S_SCALAR), H5Sclose, "create dataspace");
  Handle attr(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
              "create attribute " + name);
  const char* p = value.c_str();
  check(H5Awrite(attr, type, &p), "write attribute " + name);
}

std::vector<std::string> read_strings(hid_t group, const std::string& name) {
  Handle set(H5Dopen2(group, name.c_str(), H5P_DEFAULT), H5Dclose, "open dataset " + name);
  Handle space(H5Dget_space(set), H5Sclose, "get dataspace");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  std::vector<char*> ptrs(n, nullptr);
  Handle type = string_type();
  if (n) check(H5Dread(set, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()), "read " + name);
  std::vector<std::string> out;
  for (char* p : ptrs) out.emplace_back(p ? p : "");
  if (n) H5Dvlen_reclaim(type, space, H5P_DEFAULT, ptrs.data());
  return out;
}

std::vector<std::vector<int>> read_lists(hid_t group, const std::string& name) {
  auto values = read_column<int64_t>(group, name);
  auto offsets = read_column<int64_t>(group, name + "_offsets");
  std::vector<std::vector<int>> out;
  for (size_t i = 0; i + 1 < offsets.size(); ++i)
    out.emplace_back(values.begin() + offsets[i], values.begin() + offsets[i + 1]);
  return out;
}

std::string read_attr_string(hid_t obj, const std::string& name) {
  Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose, "open attribute " + name);
  Handle type = string_type();
  char* p = nullptr;
  check(H5Aread(attr, type, &p), "read attribute " + name);
  std::string s = p ? p : "";
  H5free_memory(p);
  return s;
}

bool has_attr(hid_t obj, const std::string& name) { return H5Aexists(obj, name.c_str()) > 0; }

void quiet_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string now_iso8601() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

}  // namespace dawnpiper::h5
