#include "runtime/checkpoint_files.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include "runtime/zero_shard.h"
#include "util/files.h"

namespace dawnpiper::checkpoint_files {

std::string step_dir(const std::string& dir, int64_t step) { return dir + "/step-" + std::to_string(step); }
std::string manifest_path(const std::string& dir, int64_t step) { return step_dir(dir, step) + "/manifest.json"; }
std::string stage_file(const std::string& dir, int64_t step, int stage, int replica) {
  return step_dir(dir, step) + "/stage-" + std::to_string(stage) +
         (replica > 0 ? "-replica-" + std::to_string(replica) : std::string()) + ".h5";
}

std::pair<int64_t, int64_t> sharding_of(PipelineStage& stage) {
  if (!stage.zero_shard()) return {0, stage.config().replicas};
  return {stage.zero_shard()->level(), stage.config().replicas};
}

FileSum file_sum(const std::string& path) {
  FileSum r;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return r;
  std::vector<uint64_t> words(size_t{1} << 17);  // 1 MiB
  uint64_t h = 0x243F6A8885A308D3ull;
  int64_t bytes = 0;
  for (;;) {
    const size_t n = std::fread(words.data(), 1, words.size() * 8, f);
    if (n == 0) break;
    if (n % 8)
      std::fill(reinterpret_cast<char*>(words.data()) + n, reinterpret_cast<char*>(words.data()) + (n + 7) / 8 * 8, 0);
    for (size_t i = 0; i < (n + 7) / 8; ++i) {
      h = (h ^ words[i]) * 0x9E3779B97F4A7C15ull;
      h ^= h >> 29;
    }
    bytes += static_cast<int64_t>(n);
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return r;
  r.bytes = bytes;
  r.sum = (h ^ static_cast<uint64_t>(bytes)) * 0xBF58476D1CE4E5B9ull;
  return r;
}
std::string hex(uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof text, "%016" PRIx64, v);
  return text;
}

std::vector<int64_t> step_directories(const std::string& dir) {
  std::vector<int64_t> steps;
  for (const std::string& name : list_directory(dir)) {
    if (name.rfind("step-", 0) != 0 || name.size() == 5) continue;
    if (name.find_first_not_of("0123456789", 5) != std::string::npos) continue;
    steps.push_back(std::stoll(name.substr(5)));
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

bool is_complete(const std::string& dir, int64_t step) { return std::ifstream(manifest_path(dir, step)).good(); }

std::vector<StateOwner> state_owners(PipelineStage& stage) {
  std::vector<StateOwner> owners;
  const auto& ps = stage.module().parameters();
  if (const ZeroShard* zero = stage.zero_shard())
    for (const ShardLayout::Piece& piece : zero->layout().pieces)
      owners.push_back({piece.param, piece.offset, piece.numel});
  else
    for (size_t i = 0; i < ps.size(); ++i) owners.push_back({i, 0, ps[i].tensor.numel()});
  if (owners.size() != stage.optimizer().params().size())
    throw std::logic_error("checkpoint: the optimizer updates other tensors than the stage's parameters");
  return owners;
}

}  // namespace dawnpiper::checkpoint_files
