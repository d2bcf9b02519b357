#pragma once
// Presets changed, in test tables: "preset/k" puts its output projection in k chunks
// (--output-chunks k), "preset@t" fuses it with the loss, t positions at a time
// (--loss-chunk-tokens t); a "+attn" suffix makes each attention one fused call
// (--attention fused). Further overrides follow as " key=value" words (" seq-len=64").
#include <sstream>
#include <string>

#include "models/model_config.h"

namespace dawnpiper::test {

inline ModelConfig chunked_preset(std::string spec) {
  std::istringstream words(spec);
  words >> spec;
  const std::string fused = "+attn";
  const bool fused_attention =
      spec.size() > fused.size() && spec.compare(spec.size() - fused.size(), fused.size(), fused) == 0;
  if (fused_attention) spec.resize(spec.size() - fused.size());
  const size_t mark = spec.find_first_of("/@");
  ModelConfig c = preset_config(spec.substr(0, mark));
  if (mark != std::string::npos)
    set_integer_override(c, spec[mark] == '/' ? "output-chunks" : "loss-chunk-tokens",
                         std::stoll(spec.substr(mark + 1)));
  c.fused_attention = fused_attention;
  for (std::string word; words >> word;) {
    const size_t eq = word.find('=');
    const std::string name = word.substr(0, eq), value = word.substr(eq + 1);
    if (name == "dropout")
      set_dropout(c, std::stod(value));
    else
      set_integer_override(c, name, std::stoll(value));
  }
  return c;
}

}  // namespace dawnpiper::test
