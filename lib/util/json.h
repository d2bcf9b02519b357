#pragma once
// A minimal JSON value with a writer and a parser: enough for plans, configs and machine-readable
// output without an external library. Objects keep their keys in insertion order so written files
// read in a stable, human-friendly order. Integers are kept exactly (int64), other numbers as
// double written with 17 significant digits, so values round-trip bit for bit.
#include <cstdint>
#include <string>
#include <vector>

namespace dawnpiper {

class Json {
 public:
  enum class Type { Null, Bool, Number, String, Array, Object };

  Json() = default;  // null
  Json(bool value);  // NOLINT(google-explicit-constructor): JSON literals read naturally
  Json(int value);
  Json(int64_t value);
  Json(double value);
  Json(const char* value);
  Json(std::string value);
  static Json array();
  static Json object();

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::Null; }
  bool is_number() const { return type_ == Type::Number; }
  bool is_string() const { return type_ == Type::String; }
  bool is_array() const { return type_ == Type::Array; }
  bool is_object() const { return type_ == Type::Object; }
  // True for numbers written without fraction or exponent that fit an int64.
  bool is_integer() const { return type_ == Type::Number && is_integer_; }

  // Typed access; throws ConfigError naming the expected type on mismatch.
  bool as_bool() const;
  double as_double() const;  // any number
  int64_t as_int() const;    // integers only
  const std::string& as_string() const;

  // Arrays.
  size_t size() const;  // elements of an array, members of an object, 0 otherwise
  const Json& operator[](size_t index) const;
  void push_back(Json value);  // turns null into an array
  const std::vector<Json>& items() const;

  // Objects. operator[] inserts a null member when missing (turns null into an object);
  // at() throws ConfigError naming the missing key.
  Json& operator[](const std::string& key);
  const Json& at(const std::string& key) const;
  bool contains(const std::string& key) const;
  const std::vector<std::string>& keys() const { return keys_; }

  // indent < 0: one line; otherwise pretty-printed with `indent` spaces per level.
  std::string dump(int indent = -1) const;
  // Throws ConfigError with the byte offset of the first error.
  static Json parse(const std::string& text);

 private:
  void expect(Type type, const char* what) const;
  void dump_to(std::string& out, int indent, int level) const;

  Type type_ = Type::Null;
  bool bool_ = false;
  bool is_integer_ = false;
  int64_t integer_ = 0;
  double number_ = 0;
  std::string string_;
  std::vector<Json> values_;       // array elements or object member values
  std::vector<std::string> keys_;  // object member names, parallel to values_
};

// Appends `text` to `out` as a quoted JSON string with escapes.
void json_escape(const std::string& text, std::string& out);

}  // namespace dawnpiper
