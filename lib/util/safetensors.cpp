#include "util/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "util/atomic_file.h"
#include "util/error.h"
#include "util/json.h"

namespace dawnpiper {

namespace {
int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}
}  // namespace

namespace {

struct DTypeCode {
  const char* code;
  DType dtype;
};
const DTypeCode kCodes[] = {{"F32", DType::F32}, {"I64", DType::I64},  {"BF16", DType::BF16}, {"F16", DType::F16},
                            {"F64", DType::F64}, {"I32", DType::I32},  {"I16", DType::I16},   {"I8", DType::I8},
                            {"U8", DType::U8},   {"BOOL", DType::Bool}};

DType dtype_of_code(const std::string& code, const std::string& where) {
  for (const DTypeCode& c : kCodes)
    if (code == c.code) return c.dtype;
  throw ConfigError(where + ": unsupported dtype " + code);
}

const char* code_of_dtype(DType d) {
  for (const DTypeCode& c : kCodes)
    if (c.dtype == d) return c.code;
  return "F32";
}

// The header's tensors (checked against the data section) and its string metadata.
void read_entries(const std::string& path, const Json& root, uint64_t data_bytes,
                  std::map<std::string, SafetensorsEntry>& entries, std::map<std::string, std::string>& metadata) {
  for (const auto& [key, v] : root.items()) {
    if (key == "__metadata__") {
      for (const auto& [m, value] : v.items()) metadata[m] = value.get<std::string>();
      continue;
    }
    SafetensorsEntry e;
    e.name = key;
    e.dtype = dtype_of_code(v.at("dtype").get<std::string>(), "'" + path + "', tensor " + key);
    for (const Json& d : v.at("shape")) e.shape.push_back(d.get<int64_t>());
    const Json& range = v.at("data_offsets");
    e.begin = static_cast<uint64_t>(range[0].get<int64_t>());
    e.end = static_cast<uint64_t>(range[1].get<int64_t>());
    const uint64_t expected = static_cast<uint64_t>(element_count(e.shape) * dtype_size(e.dtype));
    if (e.end < e.begin || e.end - e.begin != expected)
      throw ConfigError("'" + path + "': tensor " + key + " has " + std::to_string(e.end - e.begin) +
                        " bytes for shape " + shape_text(e.shape) + " (" + std::to_string(expected) + " expected)");
    if (e.end > data_bytes)
      throw ConfigError("'" + path + "' is truncated: tensor " + key + " ends at byte " + std::to_string(e.end) +
                        " of a " + std::to_string(data_bytes) + "-byte data section");
    entries[key] = std::move(e);
  }
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw ConfigError("cannot read '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < 8) {
    ::close(fd);
    throw ConfigError("'" + path + "' is not a safetensors file (shorter than its 8-byte header size)");
  }
  size_ = static_cast<size_t>(st.st_size);
  void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapped == MAP_FAILED) throw ConfigError("cannot map '" + path + "': " + std::strerror(errno));
  base_ = static_cast<const uint8_t*>(mapped);
  try {
    uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = (header << 8) | base_[i];
    if (header > size_ - 8)
      throw ConfigError("'" + path + "' is truncated or not a safetensors file (header of " + std::to_string(header) +
                        " bytes in a " + std::to_string(size_) + "-byte file)");
    data_offset_ = 8 + header;
    const Json root = read_json("'" + path + "' is not a safetensors file: its header is not JSON", [&] {
      return Json::parse(std::string(reinterpret_cast<const char*>(base_ + 8), static_cast<size_t>(header)));
    });
    if (!root.is_object()) throw ConfigError("'" + path + "' is not a safetensors file: its header is not an object");
    read_json("'" + path + "': malformed safetensors header",
              [&] { read_entries(path, root, size_ - data_offset_, entries_, metadata_); });
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(base_), size_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw ConfigError("'" + path_ + "' has no tensor " + name);
  return it->second;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& kv : entries_) out.push_back(kv.first);
  return out;
}

std::string SafetensorsFile::metadata(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? std::string() : it->second;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json m = Json::object();
    for (const auto& kv : metadata) m[kv.first] = kv.second;
    header["__metadata__"] = m;
  }
  uint64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(element_count(t.shape) * dtype_size(t.dtype));
    Json e = Json::object();
    e["dtype"] = code_of_dtype(t.dtype);
    Json shape = Json::array();
    for (int64_t d : t.shape) shape.push_back(Json(d));
    e["shape"] = shape;
    Json range = Json::array();
    range.push_back(Json(static_cast<int64_t>(offset)));
    range.push_back(Json(static_cast<int64_t>(offset + bytes)));
    e["data_offsets"] = range;
    header[t.name] = e;
    offset += bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';  // the data section starts 8-byte aligned
  write_atomically(path, [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary);
    uint8_t size[8];
    uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) size[i] = static_cast<uint8_t>(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(size), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const SafetensorsTensor& t : tensors)
      out.write(static_cast<const char*>(t.data),
                static_cast<std::streamsize>(element_count(t.shape) * dtype_size(t.dtype)));
    out.flush();
    if (!out) throw ConfigError("cannot write '" + path + "' (disk full?)");
  });
}

}  // namespace dawnpiper
