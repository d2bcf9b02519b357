// config.json of a Hugging Face export: special-token ids the vocabulary does not hold are
// dropped (a GPT-2 config made with vocab_size=4096 keeps bos/eos 50256).
#include <catch2/catch.hpp>

#include "models/hf_config.h"

using namespace dawnpiper;

TEST_CASE("a saved config names only tokens its vocabulary holds", "[models]") {
  const Json exported = Json::parse(R"({"model_type": "gpt2", "vocab_size": 4096, "bos_token_id": 50256,
    "eos_token_id": [4095, 50256], "pad_token_id": 0, "sep_token_id": -1, "n_embd": 256,
    "decoder": {"vocab_size": 100, "decoder_start_token_id": 100, "unk_token_id": 3}})");
  const Json saved = saved_hf_config(exported, "GPT2LMHeadModel");
  CHECK(saved["architectures"] == Json::array({"GPT2LMHeadModel"}));
  CHECK(saved["bos_token_id"].is_null());
  CHECK(saved["eos_token_id"] == Json::array({4095}));  // the ids the model has, of several
  CHECK(saved["pad_token_id"] == 0);
  CHECK(saved["sep_token_id"].is_null());
  CHECK(saved["n_embd"] == 256);  // not a token id
  // A sub-config with a vocabulary of its own is checked against it.
  CHECK(saved["decoder"]["decoder_start_token_id"].is_null());
  CHECK(saved["decoder"]["unk_token_id"] == 3);
  // Every id outside: null, not an empty list.
  Json all_outside = Json::parse(R"({"vocab_size": 10, "eos_token_id": [10, 11]})");
  drop_token_ids_outside_vocab(all_outside);
  CHECK(all_outside["eos_token_id"].is_null());
  // Without a vocabulary size nothing is changed.
  Json no_vocab = Json::parse(R"({"eos_token_id": 50256})");
  drop_token_ids_outside_vocab(no_vocab);
  CHECK(no_vocab["eos_token_id"] == 50256);
}
