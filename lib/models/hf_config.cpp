#include "models/hf_config.h"

namespace dawnpiper {

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

void drop_token_ids_outside_vocab(Json& config) {
  if (!config.is_object()) return;
  for (auto& [key, value] : config.items())
    if (value.is_object()) drop_token_ids_outside_vocab(value);  // a text_config, a decoder's
  if (!config.contains("vocab_size") || !config["vocab_size"].is_number_integer()) return;
  const int64_t vocab = config["vocab_size"].get<int64_t>();
  const auto outside = [vocab](const Json& id) {
    return id.is_number_integer() && (id.get<int64_t>() >= vocab || id.get<int64_t>() < 0);
  };
  for (auto& [key, value] : config.items()) {
    if (!ends_with(key, "_token_id")) continue;
    if (outside(value)) {
      value = nullptr;
    } else if (value.is_array()) {  // several end-of-sequence ids: keep those the model has
      Json kept = Json::array();
      for (const Json& id : value)
        if (!outside(id)) kept.push_back(id);
      value = kept.empty() ? Json(nullptr) : kept;
    }
  }
}

Json saved_hf_config(const Json& hf_config, const std::string& model_class) {
  Json config = hf_config;
  if (!model_class.empty()) config["architectures"] = Json::array({model_class});
  drop_token_ids_outside_vocab(config);
  return config;
}

}  // namespace dawnpiper
