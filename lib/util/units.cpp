#include "util/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>

#include "util/error.h"

namespace dawnpiper {

int64_t parse_capacity(const std::string& text, const std::string& what) {
  const int64_t bytes = parse_bytes(text, what);
  if (bytes <= 0) throw ConfigError(what + " must be positive (leave it out for the default)");
  return bytes;
}

int64_t parse_bytes(const std::string& text, const std::string& what) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw ConfigError(what + " '" + text + "' is not a size (examples: 512MiB, 40GiB, 1000000)");
  }
  std::string unit;
  for (size_t i = pos; i < text.size(); ++i)
    if (!std::isspace(static_cast<unsigned char>(text[i])))
      unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  double scale = 0;
  if (unit.empty() || unit == "b")
    scale = 1;
  else if (unit == "kib" || unit == "k")
    scale = 1024.0;
  else if (unit == "mib" || unit == "m")
    scale = 1024.0 * 1024;
  else if (unit == "gib" || unit == "g")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "tib" || unit == "t")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb")
    scale = 1e3;
  else if (unit == "mb")
    scale = 1e6;
  else if (unit == "gb")
    scale = 1e9;
  else if (unit == "tb")
    scale = 1e12;
  if (scale == 0 || !(value >= 0) || !std::isfinite(value))
    throw ConfigError(what + " '" + text + "' is not a size (examples: 512MiB, 40GiB, 1000000)");
  return static_cast<int64_t>(std::llround(value * scale));
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = bytes;
  while (std::fabs(v) >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%.0f B", v);
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace dawnpiper
