#pragma once
// Deterministic 64-bit mixing of seeds (splitmix64): parameters, data samples and dropout masks
// each draw from a seed mixed with what identifies them.
#include <cstdint>

namespace dawnpiper {

inline uint64_t mix_seed(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9e3779b97f4a7c15ULL * (b + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace dawnpiper
