#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/core/grad_mode.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "data/scalar_type.h"
#include "util/error.h"
#include "util/seed.h"
#include "util/files.h"
#include "util/json.h"

namespace dawnpiper {

TokenFile::TokenFile(const std::string& path) : path_(path) {
  check_readable(path, "token file");
  const std::string meta_path = path + ".json";
  std::string text;
  try {
    text = read_text_file(meta_path);
  } catch (const ConfigError&) {
    throw ConfigError("token file '" + path + "' has no metadata '" + meta_path +
                      "' (make both with scripts/prepare_data.py)");
  }
  std::string dtype;
  read_json("'" + meta_path + "' is not token-file metadata", [&] {
    const Json meta = Json::parse(text);
    if (!meta.contains("format") || meta.at("format").get<std::string>() != "dawnpiper-tokens")
      throw ConfigError("'" + meta_path + "' is not token-file metadata");
    dtype = meta.at("dtype").get<std::string>();
    tokens_ = meta.at("tokens").get<int64_t>();
    vocab_ = meta.at("vocab_size").get<int64_t>();
  });
  if (dtype != "uint16" && dtype != "uint32") throw ConfigError("'" + meta_path + "': dtype must be uint16 or uint32");
  wide_ = dtype == "uint32";
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw ConfigError("cannot read token file '" + path + "': " + std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  bytes_ = static_cast<size_t>(st.st_size);
  const size_t expected = static_cast<size_t>(tokens_) * (wide_ ? 4 : 2);
  if (bytes_ != expected) {
    ::close(fd);
    throw ConfigError("token file '" + path + "' has " + std::to_string(bytes_) + " bytes; its metadata says " +
                      std::to_string(tokens_) + " " + dtype + " tokens (" + std::to_string(expected) + " bytes)");
  }
  if (bytes_ > 0) {
    void* mapped = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) {
      ::close(fd);
      throw ConfigError("cannot map token file '" + path + "': " + std::strerror(errno));
    }
    base_ = static_cast<const uint8_t*>(mapped);
  }
  ::close(fd);
}

TokenFile::~TokenFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), bytes_);
}

void TokenFile::check_ids_below(int64_t vocab, const std::string& model) const {
  for (int64_t i = 0; i < tokens_; ++i)
    if (at(i) >= vocab)
      throw ConfigError("token file '" + path_ + "' holds id " + std::to_string(at(i)) + " at offset " +
                        std::to_string(i) + ", outside " + model + "'s vocabulary of " + std::to_string(vocab) +
                        " (prepare the data with --vocab-size " + std::to_string(vocab) + " or less)");
}

namespace {
int64_t model_vocab(const OpGraph& g, const Node& input) {
  if (input.ints.count("vocab")) return input.attr_int("vocab", 0);
  for (const Node& n : g.nodes)
    if (n.kind == OpKind::Embedding && !n.params.empty()) return n.params[0].shape[0];
  return 0;
}

int64_t seq_len_of(const OpGraph& graph) {
  int64_t seq_len = 0;
  for (const Node& n : graph.nodes) {
    if (n.kind != OpKind::Input || n.role == "zeros") continue;
    if (!is_token_role(n.role))
      throw ConfigError("input " + n.name + " of " + graph.preset + " (role '" + n.role +
                        "') cannot come from a token file; give its samples in a sample file (--data FILE.safetensors, "
                        "docs/training.md) or train it on synthetic data (no --data)");
    seq_len = graph.tensor(n.outputs[0]).shape.at(1);
  }
  if (seq_len < 1) throw ConfigError(graph.preset + " reads no tokens");
  return seq_len;
}
}  // namespace

TokenFileData::TokenFileData(const OpGraph& graph, std::shared_ptr<const TokenFile> file, const DataConfig& config,
                             uint64_t seed, DataSplit split, int64_t needed)
    : DataSource(graph),
      file_(std::move(file)),
      seed_(seed),
      seq_len_(seq_len_of(graph)),
      order_(file_->size() > 0 ? (file_->size() - 1) / seq_len_ : 0, config.validation_fraction, split,
             config.sequential, seed) {
  int64_t vocab = 0;
  for (const Node& n : graph.nodes)
    if (n.kind == OpKind::Input && n.role != "zeros") vocab = std::max(vocab, model_vocab(graph, n));
  if (vocab > 0) file_->check_ids_below(vocab, graph.preset);
  const char* what = split == DataSplit::Train ? "training" : "validation";
  if (order_.count() < needed)
    throw ConfigError("token file '" + file_->path() + "' is too short: " + std::to_string(file_->size()) +
                      " tokens give " + std::to_string(order_.count()) + " " + what + " windows of " +
                      std::to_string(seq_len_ + 1) + " tokens, one step needs " + std::to_string(needed));
}

void TokenFileData::load(TensorEnv& env, const std::vector<int>& wanted, int64_t first_sample,
                         at::Device device) const {
  at::NoGradGuard no_grad;
  for (int t : wanted) {
    const TensorInfo& info = graph_->tensor(t);
    const Node& input = graph_->nodes[info.producer];
    if (input.role == "zeros") {  // BERT's additive padding mask: nothing is padding
      env.at(t) = at::zeros(info.shape, at::TensorOptions(scalar_type(info.dtype)).device(device));
      continue;
    }
    std::vector<at::Tensor> samples;
    for (int64_t b = 0; b < info.shape.at(0); ++b) {
      const int64_t sample = first_sample + b;
      const int64_t start = order_.at(sample) * seq_len_;
      std::vector<int64_t> window(static_cast<size_t>(seq_len_ + 1));
      for (int64_t i = 0; i <= seq_len_; ++i) window[static_cast<size_t>(i)] = file_->at(start + i);
      at::Generator gen = at::detail::createCPUGenerator(mix_seed(seed_ ^ 0xda7aULL, sample));
      samples.push_back(token_input(input, window, seq_len_, gen));
    }
    env.at(t) = at::stack(samples).to(device, scalar_type(info.dtype));
  }
}

}  // namespace dawnpiper
