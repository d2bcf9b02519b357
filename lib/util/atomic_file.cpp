#include "util/atomic_file.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "util/error.h"

namespace dawnpiper {

void write_atomically(const std::string& path,
                      const std::function<void(const std::string&)>& write) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream probe(tmp, std::ios::binary | std::ios::trunc);
    if (!probe) throw ConfigError("cannot write '" + path + "' (is the directory writable?)");
  }
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

void write_text_atomically(const std::string& path, const std::string& content) {
  write_atomically(path, [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << content;
    out.close();
    if (!out) throw ConfigError("failed writing '" + path + "'");
  });
}

}  // namespace dawnpiper
