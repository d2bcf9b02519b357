#pragma once
// Byte sizes as users write them ("512MiB", "40GiB", "1.5GB", "1000") and as we print them.
#include <cstdint>
#include <string>

namespace dawnpiper {

// Parses a size; binary (KiB, MiB, GiB, TiB) and decimal (KB, MB, GB, TB) suffixes, case
// insensitive, optional "B". Throws ConfigError naming `what` on malformed or negative input.
int64_t parse_bytes(const std::string& text, const std::string& what = "size");

// A memory capacity without a limit, wherever a capacity is held (options, plans, allocators).
constexpr int64_t kUnlimitedBytes = INT64_MAX;
// A memory capacity (--device-memory, --memory): parse_bytes, and it must be positive.
int64_t parse_capacity(const std::string& text, const std::string& what);

// "1.50 GiB", "312.0 MiB", "17 B".
std::string format_bytes(double bytes);

}  // namespace dawnpiper
