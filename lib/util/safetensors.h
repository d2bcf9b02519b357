#pragma once
// Reading and writing safetensors files (the format Hugging Face checkpoints and DawnPiper model
// files use): an 8-byte little-endian header size, a JSON header naming every tensor's dtype,
// shape and byte range, optional string metadata, then the raw little-endian data. Pure C++:
// the file is memory-mapped, and a tensor's bytes are read only when asked for, so a rank loads
// only its own stage's weights.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "util/dtype.h"

namespace dawnpiper {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range in the data section
};

class SafetensorsFile {
 public:
  // Maps the file and parses its header; throws ConfigError naming the file and what is wrong
  // (missing, truncated, not safetensors, a tensor outside the file, an unknown dtype).
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  const SafetensorsEntry& entry(const std::string& name) const;  // throws ConfigError if absent
  const void* data(const SafetensorsEntry& e) const { return base_ + data_offset_ + e.begin; }
  std::vector<std::string> names() const;
  // The header's "__metadata__" string value for key, or "" if absent.
  std::string metadata(const std::string& key) const;

 private:
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  uint64_t data_offset_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: its bytes are copied from `data` (contiguous, little-endian).
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes a safetensors file atomically (a temporary file renamed over `path`).
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace dawnpiper
