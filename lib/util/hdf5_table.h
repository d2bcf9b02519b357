#pragma once
// Tables of rows kept as one HDF5 dataset per column (the profile's nodes and tensors, the
// trace's actions and stages). A table is one list of columns, each naming where a row keeps its
// value, so what is written and what is read back cannot drift apart.
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "util/hdf5_io.h"

namespace dawnpiper::h5 {

template <typename Row>
struct Column {
  std::string name;
  // Added within a schema version: files written before lack it, and rows keep their defaults.
  bool optional = false;
  std::function<void(hid_t group, const std::vector<Row>& rows)> write;
  // size_rows: the rows take this column's length; else a column of another length throws
  // std::runtime_error.
  std::function<void(hid_t group, std::vector<Row>& rows, bool size_rows)> read;
};

// What a value is stored as: integers and bools as int64, floating point as double, strings,
// lists of ints.
template <typename T>
using Stored =
    std::conditional_t<std::is_floating_point_v<T>, double, std::conditional_t<std::is_integral_v<T>, int64_t, T>>;

template <typename T>
std::vector<T> read_values(hid_t group, const std::string& name) {
  if constexpr (std::is_same_v<T, std::string>)
    return read_strings(group, name);
  else if constexpr (std::is_same_v<T, std::vector<int>>)
    return read_lists(group, name);
  else
    return read_column<T>(group, name);
}

template <typename T>
void write_values(hid_t group, const std::string& name, const std::vector<T>& values) {
  if constexpr (std::is_same_v<T, std::string>)
    write_strings(group, name, values);
  else if constexpr (std::is_same_v<T, std::vector<int>>)
    write_lists(group, name, values);
  else
    write_column<T>(group, name, values);
}

// A column from a row's getter and setter.
template <typename Row, typename Get, typename Set>
Column<Row> column_of(std::string name, Get get, Set set, bool optional = false) {
  using T = std::decay_t<decltype(get(std::declval<const Row&>()))>;
  using S = Stored<T>;
  Column<Row> c;
  c.name = name;
  c.optional = optional;
  c.write = [name, get](hid_t group, const std::vector<Row>& rows) {
    std::vector<S> values;
    values.reserve(rows.size());
    for (const Row& r : rows) values.push_back(static_cast<S>(get(r)));
    write_values(group, name, values);
  };
  c.read = [name, set](hid_t group, std::vector<Row>& rows, bool size_rows) {
    std::vector<S> values = read_values<S>(group, name);
    if (size_rows) rows.resize(values.size());
    if (values.size() != rows.size())
      throw std::runtime_error("column " + name + " has " + std::to_string(values.size()) + " values for " +
                               std::to_string(rows.size()) + " rows");
    for (size_t i = 0; i < rows.size(); ++i) set(rows[i], static_cast<T>(std::move(values[i])));
  };
  return c;
}

// A column holding one member of each row.
template <typename Row, typename T>
Column<Row> member(std::string name, T Row::*field, bool optional = false) {
  return column_of<Row>(
      std::move(name), [field](const Row& r) -> const T& { return r.*field; },
      [field](Row& r, T value) { r.*field = std::move(value); }, optional);
}

template <typename Row>
void write_table(hid_t group, const std::vector<Row>& rows, const std::vector<Column<Row>>& columns) {
  for (const Column<Row>& c : columns) c.write(group, rows);
}

// The rows take their count from the first column, which must not be optional.
template <typename Row>
std::vector<Row> read_table(hid_t group, const std::vector<Column<Row>>& columns) {
  std::vector<Row> rows;
  bool sized = false;
  for (const Column<Row>& c : columns)
    if (!c.optional || H5Lexists(group, c.name.c_str(), H5P_DEFAULT) > 0) c.read(group, rows, !sized), sized = true;
  return rows;
}

}  // namespace dawnpiper::h5
