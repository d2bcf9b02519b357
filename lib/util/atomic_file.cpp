#include "util/atomic_file.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "util/error.h"

namespace dawnpiper {

void write_atomically(const std::string& path, const std::function<void(const std::string&)>& write) {
  check_writable(path);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    write(tmp);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw ConfigError("cannot move the finished file to '" + path + "'");
  }
}

void check_writable(const std::string& path) {
  const std::string probe_path = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream probe(probe_path, std::ios::binary | std::ios::trunc);
    if (!probe) throw ConfigError("cannot write '" + path + "' (is the directory writable?)");
  }
  std::remove(probe_path.c_str());
}

void write_text_atomically(const std::string& path, const std::string& content) {
  write_atomically(path, [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << content;
    out.close();
    if (!out) throw ConfigError("failed writing '" + path + "'");
  });
}

}  // namespace dawnpiper
