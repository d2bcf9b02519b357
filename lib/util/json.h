#pragma once
// JSON for plans, model files, safetensors headers and token-file metadata: nlohmann-json with
// objects kept in insertion order, so written files read in a stable, human-friendly order.
// Integers stay exact (int64), other numbers are written with 17 significant digits and
// round-trip bit for bit.
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "util/enum_names.h"
#include "util/field_list.h"

namespace dawnpiper {

using Json = nlohmann::ordered_json;

// The ConfigError read_json throws.
[[noreturn]] void throw_json_error(const std::string& what, const nlohmann::json::exception& e);

// Runs `read` (which parses and reads JSON) and turns the library's errors (syntax, a missing
// key, a wrong type) into one ConfigError: "<what>: <the library's message>".
template <class Read>
auto read_json(const std::string& what, Read&& read) -> decltype(read()) {
  try {
    return read();
  } catch (const nlohmann::json::exception& e) {
    throw_json_error(what, e);
  }
}

// Writer and reader of a field list (util/field_list.h) as a JSON object; enums with EnumNames
// go by name.

struct JsonWriter {
  Json& out;
  template <class T>
  void operator()(const char* key, const T& value, bool /*optional*/ = false) const {
    if constexpr (has_enum_names<T>::value)
      out[key] = name_of(value);
    else
      out[key] = value;
  }
};

struct JsonReader {
  const Json& in;
  template <class T>
  void operator()(const char* key, T& value, bool optional = false) const {
    if (optional && !in.contains(key)) return;
    if constexpr (has_enum_names<T>::value)
      value = from_name<T>(in.at(key).template get<std::string>());
    else
      value = in.at(key).template get<T>();
  }
};

}  // namespace dawnpiper
