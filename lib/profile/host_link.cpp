#include "profile/host_link.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "util/error.h"
#include "util/json.h"
#include "util/units.h"

namespace dawnpiper {

namespace {
double interpolated(const std::vector<LinkSample>& s, int64_t bytes, double LinkSample::*bandwidth) {
  if (bytes <= s.front().bytes) return s.front().*bandwidth;
  if (bytes >= s.back().bytes) return s.back().*bandwidth;
  size_t i = 1;
  while (s[i].bytes < bytes) ++i;
  const double a = std::log(static_cast<double>(s[i - 1].bytes)), b = std::log(static_cast<double>(s[i].bytes));
  const double t = (std::log(static_cast<double>(bytes)) - a) / (b - a);
  return s[i - 1].*bandwidth + t * (s[i].*bandwidth - s[i - 1].*bandwidth);
}
}  // namespace

double HostLink::copy_seconds(int64_t bytes) const {
  if (samples.empty() || bytes <= 0) return 0;
  const double slower = std::min(interpolated(samples, bytes, &LinkSample::to_host),
                                 interpolated(samples, bytes, &LinkSample::to_device));
  return static_cast<double>(bytes) / slower;
}

std::string HostLink::summary() const {
  if (samples.empty()) return "not measured";
  char text[256];
  const LinkSample &a = samples.front(), &b = samples.back();
  std::snprintf(text, sizeof text, "to the host %.1f GB/s at %s .. %.1f GB/s at %s, to the device %.1f .. %.1f GB/s",
                a.to_host / 1e9, format_bytes(static_cast<double>(a.bytes)).c_str(), b.to_host / 1e9,
                format_bytes(static_cast<double>(b.bytes)).c_str(), a.to_device / 1e9, b.to_device / 1e9);
  return text;
}

std::string HostLink::to_json() const {
  Json rows = Json::array();
  for (const LinkSample& s : samples) rows.push_back({s.bytes, s.to_host, s.to_device, s.both});
  return rows.dump();
}

HostLink HostLink::from_json(const std::string& text) {
  HostLink link;
  try {
    for (const Json& row : Json::parse(text)) {
      if (row.size() != 4) throw ConfigError("a host link sample is [bytes, to_host, to_device, both]");
      LinkSample s{row[0].get<int64_t>(), row[1].get<double>(), row[2].get<double>(), row[3].get<double>()};
      if (s.bytes <= 0 || !(s.to_host > 0) || !(s.to_device > 0) || !(s.both > 0))
        throw ConfigError("a host link sample needs a positive size and bandwidths");
      if (!link.samples.empty() && s.bytes <= link.samples.back().bytes)
        throw ConfigError("host link samples must grow in size");
      link.samples.push_back(s);
    }
  } catch (const Json::exception& e) {
    throw ConfigError(std::string("bad host link samples: ") + e.what());
  }
  return link;
}

}  // namespace dawnpiper
