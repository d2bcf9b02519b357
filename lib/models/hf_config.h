#pragma once
// config.json for `train --save-weights DIR` of a Hugging Face export: the config the model file
// was exported from, so that transformers' from_pretrained(DIR) loads the trained weights.
#include <string>

#include "util/json.h"

namespace dawnpiper {

// The exported config with `architectures` set to the model class, and every special-token id
// (`*_token_id`, also in lists and in sub-configs with a vocabulary of their own) that lies
// outside `vocab_size` set to null: a config made smaller than its architecture's default (GPT-2
// with vocab_size=4096 keeps bos/eos 50256) must not name tokens the model cannot embed.
Json saved_hf_config(const Json& hf_config, const std::string& model_class);

// Only the special-token fix of saved_hf_config, in place (the exporter applies the same rule).
void drop_token_ids_outside_vocab(Json& config);

}  // namespace dawnpiper
