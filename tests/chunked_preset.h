#pragma once
// Presets with their LM head changed, in test tables: "preset/k" puts its output projection in k
// chunks (--output-chunks k), "preset@t" fuses it with the loss, t positions at a time
// (--loss-chunk-tokens t).
#include <string>

#include "models/model_config.h"

namespace dawnpiper::test {

inline ModelConfig chunked_preset(const std::string& spec) {
  const size_t mark = spec.find_first_of("/@");
  ModelConfig c = preset_config(spec.substr(0, mark));
  if (mark != std::string::npos)
    apply_override(c, spec[mark] == '/' ? "output-chunks" : "loss-chunk-tokens", spec.substr(mark + 1));
  return c;
}

}  // namespace dawnpiper::test
