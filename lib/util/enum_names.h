#pragma once
// The names of an enum's values, declared once per enum (a specialization of EnumNames beside
// the enum) and everything derived from that one table: a value's name, the value of a name (an
// unknown one is a ConfigError listing the choices), every value, printing by name. The option
// parser reads these enums by name as well (cli/options.h).
#include <array>
#include <cstddef>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "util/error.h"

namespace dawnpiper {

// Specialized for each named enum E:
//   template <>
//   struct EnumNames<E> {
//     static constexpr const char* what = "planner";  // errors say "unknown planner 'x'"
//     static constexpr std::array<std::pair<E, const char*>, 2> table{{{E::A, "a"}, {E::B, "b"}}};
//     // optional, for --help: what a value means, in the table's order ("" where its name says it)
//     static constexpr std::array<const char*, 2> meaning{"", "b does this"};
//   };
template <class E>
struct EnumNames;

template <class E, class = void>
struct has_enum_names : std::false_type {};
template <class E>
struct has_enum_names<E, std::void_t<decltype(EnumNames<E>::table)>> : std::true_type {};
template <class E, class = void>
struct has_enum_meaning : std::false_type {};
template <class E>
struct has_enum_meaning<E, std::void_t<decltype(EnumNames<E>::meaning)>> : std::true_type {};

template <class E>
const char* name_of(E value) {
  for (const auto& [v, name] : EnumNames<E>::table)
    if (v == value) return name;
  return "?";
}

// "a, b or c"
template <class E>
std::string enum_choices() {
  const auto& table = EnumNames<E>::table;
  std::string text;
  for (size_t i = 0; i < table.size(); ++i)
    text += (i == 0 ? "" : i + 1 == table.size() ? " or " : ", ") + std::string(table[i].second);
  return text;
}

// "a | b (b does this) | c": the choices as an option's help lists them, with their meanings;
// those `keep` keeps where given.
template <class E>
std::string enum_help(bool (*keep)(E) = nullptr) {
  const auto& table = EnumNames<E>::table;
  std::string text;
  for (size_t i = 0; i < table.size(); ++i) {
    if (keep && !keep(table[i].first)) continue;
    text += (text.empty() ? "" : " | ") + std::string(table[i].second);
    if constexpr (has_enum_meaning<E>::value) {
      static_assert(EnumNames<E>::meaning.size() == EnumNames<E>::table.size(), "one meaning per value");
      if (*EnumNames<E>::meaning[i]) text += " (" + std::string(EnumNames<E>::meaning[i]) + ")";
    }
  }
  return text;
}

template <class E>
E from_name(const std::string& name) {
  for (const auto& [v, n] : EnumNames<E>::table)
    if (name == n) return v;
  throw ConfigError("unknown " + std::string(EnumNames<E>::what) + " '" + name + "' (choose " + enum_choices<E>() +
                    ")");
}

template <class E>
std::vector<E> all_values() {
  std::vector<E> values;
  for (const auto& entry : EnumNames<E>::table) values.push_back(entry.first);
  return values;
}

template <class E, std::enable_if_t<has_enum_names<E>::value, int> = 0>
std::ostream& operator<<(std::ostream& out, E value) {
  return out << name_of(value);
}

}  // namespace dawnpiper
