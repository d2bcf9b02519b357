#pragma once
// Small HDF5 helpers shared by the profile, trace and checkpoint files: RAII handles, named
// 1-D columns (int64, double, float, strings, integer lists) and scalar attributes.
#include <hdf5.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace dawnpiper::h5 {

// RAII for HDF5 identifiers.
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t), const std::string& what) : id_(id), close_(close) {
    if (id < 0) throw std::runtime_error("HDF5: cannot " + what);
  }
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  operator hid_t() const { return id_; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

void check(herr_t status, const std::string& what);

template <typename T>
hid_t native_type();
template <>
inline hid_t native_type<int64_t>() {
  return H5T_NATIVE_INT64;
}
template <>
inline hid_t native_type<double>() {
  return H5T_NATIVE_DOUBLE;
}
template <>
inline hid_t native_type<float>() {
  return H5T_NATIVE_FLOAT;
}

template <typename T>
void write_column(hid_t group, const std::string& name, const std::vector<T>& values) {
  hsize_t dims[1] = {values.size()};
  Handle space(H5Screate_simple(1, dims, nullptr), H5Sclose, "create dataspace");
  Handle set(H5Dcreate2(group, name.c_str(), native_type<T>(), space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose,
             "create dataset " + name);
  if (!values.empty())
    check(H5Dwrite(set, native_type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), "write " + name);
}

template <typename T>
std::vector<T> read_column(hid_t group, const std::string& name) {
  Handle set(H5Dopen2(group, name.c_str(), H5P_DEFAULT), H5Dclose, "open dataset " + name);
  Handle space(H5Dget_space(set), H5Sclose, "get dataspace");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  std::vector<T> out(n);
  if (n) check(H5Dread(set, native_type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), "read " + name);
  return out;
}

template <typename T>
void write_attr(hid_t obj, const std::string& name, T value) {
  Handle space(H5Screate(H5S_SCALAR), H5Sclose, "create dataspace");
  Handle attr(H5Acreate2(obj, name.c_str(), native_type<T>(), space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
              "create attribute " + name);
  check(H5Awrite(attr, native_type<T>(), &value), "write attribute " + name);
}
void write_attr(hid_t obj, const std::string& name, const std::string& value);
inline void write_attr(hid_t obj, const std::string& name, const char* value) {
  write_attr(obj, name, std::string(value));
}

template <typename T>
T read_attr(hid_t obj, const std::string& name) {
  Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose, "open attribute " + name);
  T value{};
  check(H5Aread(attr, native_type<T>(), &value), "read attribute " + name);
  return value;
}
std::string read_attr_string(hid_t obj, const std::string& name);
bool has_attr(hid_t obj, const std::string& name);

// Raw float32 data as a 1-D dataset (checkpoints: no intermediate copy).
void write_floats(hid_t group, const std::string& name, const float* data, size_t count);
// Reads a float32 dataset of exactly `count` elements into data; throws if the size differs.
void read_floats(hid_t group, const std::string& name, float* data, size_t count);
// Reads elements [offset, offset + count) of a float32 dataset of exactly `total` elements.
void read_float_range(hid_t group, const std::string& name, int64_t total, int64_t offset, float* data, int64_t count);

void write_strings(hid_t group, const std::string& name, const std::vector<std::string>& values);
std::vector<std::string> read_strings(hid_t group, const std::string& name);
// Variable-length integer lists as two columns: NAME (all values) and NAME_offsets (n + 1).
void write_lists(hid_t group, const std::string& name, const std::vector<std::vector<int>>& lists);
std::vector<std::vector<int>> read_lists(hid_t group, const std::string& name);

// Silences HDF5's error stack printing (we report errors ourselves).
void quiet_errors();
std::string now_iso8601();

}  // namespace dawnpiper::h5
