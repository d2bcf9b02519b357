#include "profile/profile_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "profile/profile_io.h"
#include "util/error.h"
#include "util/files.h"

namespace dawnpiper {

namespace {

uint64_t fnv1a(const std::string& text, uint64_t h = 1469598103934665603ULL) {
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// Size and modification time of the running binary: a rebuilt dawnpiper measures afresh.
std::string binary_identity() {
  struct stat st {};
  if (stat("/proc/self/exe", &st) != 0) return "unknown";
  return std::to_string(st.st_size) + ":" + std::to_string(st.st_mtime);
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

std::string profile_cache_dir(const std::string& option) {
  std::string dir = option.empty() ? env("DAWNPIPER_CACHE") : option;
  if (dir == "off") return "";
  if (!dir.empty()) return dir;
  if (!env("XDG_CACHE_HOME").empty()) return env("XDG_CACHE_HOME") + "/dawnpiper";
  if (!env("HOME").empty()) return env("HOME") + "/.cache/dawnpiper";
  return "";
}

std::string profile_cache_path(const std::string& dir, const OpGraph& graph, const std::string& settings) {
  std::string key = graph.fingerprint() + "|" + graph.preset + "|" + std::to_string(graph.micro_batch_size) + "|" +
                    settings + "|" + binary_identity() + "|schema " + std::to_string(Profile::kSchemaVersion);
  for (const TensorInfo& t : graph.tensors) key += "|" + shape_str(t.shape);
  char name[40];
  std::snprintf(name, sizeof name, "profile-%016llx.h5", static_cast<unsigned long long>(fnv1a(key)));
  return dir + "/" + name;
}

std::optional<Profile> read_cached_profile(const std::string& path, const OpGraph& graph) {
  if (access(path.c_str(), R_OK) != 0) return std::nullopt;
  try {
    Profile p = read_profile(path);
    if (p.graph_hash != graph.fingerprint() || p.size() != graph.size()) return std::nullopt;
    return p;
  } catch (const std::exception&) {
    return std::nullopt;  // damaged: measured again and replaced
  }
}

bool write_cached_profile(const std::string& path, const Profile& profile) {
  try {
    make_directories(path.substr(0, path.rfind('/')));
    write_profile(profile, path);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace dawnpiper
