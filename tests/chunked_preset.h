#pragma once
// "preset/k" in test tables: the preset with its output projection in k chunks (--output-chunks).
#include <string>

#include "models/model_config.h"

namespace dawnpiper::test {

inline ModelConfig chunked_preset(const std::string& spec) {
  const size_t slash = spec.find('/');
  ModelConfig c = preset_config(spec.substr(0, slash));
  if (slash != std::string::npos) apply_override(c, "output-chunks", spec.substr(slash + 1));
  return c;
}

}  // namespace dawnpiper::test
