#include "util/json.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "util/error.h"

namespace dawnpiper {

Json::Json(bool value) : type_(Type::Bool), bool_(value) {}
Json::Json(int value) : Json(static_cast<int64_t>(value)) {}
Json::Json(int64_t value)
    : type_(Type::Number), is_integer_(true), integer_(value), number_(static_cast<double>(value)) {}
Json::Json(double value) : type_(Type::Number), number_(value) {}
Json::Json(const char* value) : type_(Type::String), string_(value) {}
Json::Json(std::string value) : type_(Type::String), string_(std::move(value)) {}

Json Json::array() {
  Json j;
  j.type_ = Type::Array;
  return j;
}

Json Json::object() {
  Json j;
  j.type_ = Type::Object;
  return j;
}

namespace {
const char* type_name(Json::Type type) {
  switch (type) {
    case Json::Type::Null:
      return "null";
    case Json::Type::Bool:
      return "a boolean";
    case Json::Type::Number:
      return "a number";
    case Json::Type::String:
      return "a string";
    case Json::Type::Array:
      return "an array";
    case Json::Type::Object:
      return "an object";
  }
  return "?";
}
}  // namespace

void Json::expect(Type type, const char* what) const {
  if (type_ != type) throw ConfigError(std::string("JSON: expected ") + what + ", found " + type_name(type_));
}

bool Json::as_bool() const {
  expect(Type::Bool, "a boolean");
  return bool_;
}

double Json::as_double() const {
  expect(Type::Number, "a number");
  return is_integer_ ? static_cast<double>(integer_) : number_;
}

int64_t Json::as_int() const {
  expect(Type::Number, "a number");
  if (!is_integer_) {
    // Accept doubles that hold an exact integer (e.g. written by another tool as 4.0).
    if (std::isfinite(number_) && number_ == std::floor(number_) && std::fabs(number_) < 9.0e18)
      return static_cast<int64_t>(number_);
    throw ConfigError("JSON: expected an integer, found " + std::to_string(number_));
  }
  return integer_;
}

const std::string& Json::as_string() const {
  expect(Type::String, "a string");
  return string_;
}

size_t Json::size() const { return (type_ == Type::Array || type_ == Type::Object) ? values_.size() : 0; }

const Json& Json::operator[](size_t index) const {
  expect(Type::Array, "an array");
  if (index >= values_.size())
    throw ConfigError("JSON: index " + std::to_string(index) + " out of range (size " + std::to_string(values_.size()) +
                      ")");
  return values_[index];
}

void Json::push_back(Json value) {
  if (type_ == Type::Null) type_ = Type::Array;
  expect(Type::Array, "an array");
  values_.push_back(std::move(value));
}

const std::vector<Json>& Json::items() const {
  expect(Type::Array, "an array");
  return values_;
}

Json& Json::operator[](const std::string& key) {
  if (type_ == Type::Null) type_ = Type::Object;
  expect(Type::Object, "an object");
  for (size_t i = 0; i < keys_.size(); ++i)
    if (keys_[i] == key) return values_[i];
  keys_.push_back(key);
  values_.emplace_back();
  return values_.back();
}

const Json& Json::at(const std::string& key) const {
  expect(Type::Object, "an object");
  for (size_t i = 0; i < keys_.size(); ++i)
    if (keys_[i] == key) return values_[i];
  throw ConfigError("JSON: missing key '" + key + "'");
}

bool Json::contains(const std::string& key) const {
  if (type_ != Type::Object) return false;
  for (const std::string& k : keys_)
    if (k == key) return true;
  return false;
}

void json_escape(const std::string& text, std::string& out) {
  out += '"';
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(c));
          out += buf;
        } else {
          out += c;  // UTF-8 passes through unchanged
        }
    }
  }
  out += '"';
}

void Json::dump_to(std::string& out, int indent, int level) const {
  auto newline = [&](int lvl) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * lvl), ' ');
  };
  switch (type_) {
    case Type::Null:
      out += "null";
      break;
    case Type::Bool:
      out += bool_ ? "true" : "false";
      break;
    case Type::Number: {
      char buf[40];
      if (is_integer_) {
        std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(integer_));
      } else if (!std::isfinite(number_)) {
        // JSON has no infinities; null is the conventional stand-in.
        out += "null";
        break;
      } else {
        std::snprintf(buf, sizeof buf, "%.17g", number_);
        // Keep it a non-integer literal so it parses back as a double.
        std::string s = buf;
        if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
        out += s;
        break;
      }
      out += buf;
      break;
    }
    case Type::String:
      json_escape(string_, out);
      break;
    case Type::Array:
      out += '[';
      for (size_t i = 0; i < values_.size(); ++i) {
        if (i) out += ',';
        newline(level + 1);
        values_[i].dump_to(out, indent, level + 1);
      }
      if (!values_.empty()) newline(level);
      out += ']';
      break;
    case Type::Object:
      out += '{';
      for (size_t i = 0; i < values_.size(); ++i) {
        if (i) out += ',';
        newline(level + 1);
        json_escape(keys_[i], out);
        out += indent < 0 ? ":" : ": ";
        values_[i].dump_to(out, indent, level + 1);
      }
      if (!values_.empty()) newline(level);
      out += '}';
      break;
  }
}

std::string Json::dump(int indent) const {
  std::string out;
  dump_to(out, indent, 0);
  return out;
}

namespace {

class Parser {
 public:
  explicit Parser(const std::string& text) : text_(text) {}

  Json parse_document() {
    Json value = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected trailing characters");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw ConfigError("JSON parse error at byte " + std::to_string(pos_) + ": " + what);
  }

  void skip_space() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\t' || text_[pos_] == '\r'))
      ++pos_;
  }

  bool consume_literal(const char* literal) {
    size_t n = std::char_traits<char>::length(literal);
    if (text_.compare(pos_, n, literal) != 0) return false;
    pos_ += n;
    return true;
  }

  Json parse_value(int depth) {
    if (depth > 512) fail("nesting too deep");
    skip_space();
    if (pos_ >= text_.size()) fail("unexpected end of input");
    char c = text_[pos_];
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') return Json(parse_string());
    if (consume_literal("true")) return Json(true);
    if (consume_literal("false")) return Json(false);
    if (consume_literal("null")) return Json();
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
    fail(std::string("unexpected character '") + c + "'");
  }

  Json parse_object(int depth) {
    Json obj = Json::object();
    ++pos_;  // {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      return obj;
    }
    for (;;) {
      skip_space();
      if (pos_ >= text_.size() || text_[pos_] != '"') fail("expected a member name");
      std::string key = parse_string();
      skip_space();
      if (pos_ >= text_.size() || text_[pos_] != ':') fail("expected ':'");
      ++pos_;
      obj[key] = parse_value(depth + 1);
      skip_space();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == '}') {
        ++pos_;
        return obj;
      }
      fail("expected ',' or '}'");
    }
  }

  Json parse_array(int depth) {
    Json arr = Json::array();
    ++pos_;  // [
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      return arr;
    }
    for (;;) {
      arr.push_back(parse_value(depth + 1));
      skip_space();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == ']') {
        ++pos_;
        return arr;
      }
      fail("expected ',' or ']'");
    }
  }

  unsigned parse_hex4() {
    if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= static_cast<unsigned>(c - 'A' + 10);
      else
        fail("bad hex digit in \\u escape");
    }
    return v;
  }

  static void append_utf8(unsigned cp, std::string& out) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    for (;;) {
      if (pos_ >= text_.size()) fail("unterminated string");
      char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail("unterminated escape");
      char e = text_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = parse_hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {  // high surrogate: a low one must follow
            if (!consume_literal("\\u")) fail("unpaired surrogate");
            unsigned low = parse_hex4();
            if (low < 0xDC00 || low >= 0xE000) fail("bad low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("unpaired surrogate");
          }
          append_utf8(cp, out);
          break;
        }
        default:
          fail(std::string("bad escape '\\") + e + "'");
      }
    }
  }

  Json parse_number() {
    size_t start = pos_;
    if (text_[pos_] == '-') ++pos_;
    auto digits = [&]() {
      size_t d = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ - d;
    };
    if (digits() == 0) fail("expected digits");
    bool integral = true;
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      integral = false;
      if (digits() == 0) fail("expected digits after '.'");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      integral = false;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (digits() == 0) fail("expected exponent digits");
    }
    std::string lexeme = text_.substr(start, pos_ - start);
    if (integral) {
      errno = 0;
      long long v = std::strtoll(lexeme.c_str(), nullptr, 10);
      if (errno != ERANGE) return Json(static_cast<int64_t>(v));
      // Too large for int64: fall through to double.
    }
    return Json(std::strtod(lexeme.c_str(), nullptr));
  }

  const std::string& text_;
  size_t pos_ = 0;
};

}  // namespace

Json Json::parse(const std::string& text) { return Parser(text).parse_document(); }

}  // namespace dawnpiper
