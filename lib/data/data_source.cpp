// Which data source --data names: synthetic (none), a token file, or a sample file.
#include "data/sample_file.h"
#include "data/token_file.h"
#include "util/seed.h"

namespace dawnpiper {

std::unique_ptr<DataSource> make_data_source(const OpGraph& graph, const DataConfig& config, uint64_t seed,
                                             DataSplit split, int64_t needed) {
  if (config.path.empty())
    return std::make_unique<SyntheticData>(graph, split == DataSplit::Train ? seed : mix_seed(seed, 0x7a11dULL));
  if (is_sample_file(config.path))
    return std::make_unique<SampleFileData>(graph, std::make_shared<SafetensorsFile>(config.path), config, seed, split,
                                            needed);
  return std::make_unique<TokenFileData>(graph, std::make_shared<TokenFile>(config.path), config, seed, split, needed);
}

void check_data_file(const std::string& path) {
  if (is_sample_file(path))
    sample_count(SafetensorsFile(path));
  else
    TokenFile check(path);
}

}  // namespace dawnpiper
