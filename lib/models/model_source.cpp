#include "models/model_source.h"

#include "util/error.h"

namespace dawnpiper {

ModelSource ModelSource::file(const std::string& path, const std::string& init_from) {
  ModelSource s;
  s.file_ = read_model_file(path);
  s.init_from_ = init_from;
  return s;
}

OpGraph ModelSource::graph(int64_t micro_batch_size) const {
  if (file_) return build_imported(*file_, micro_batch_size, init_from_);
  return build_model(*config_, micro_batch_size);
}

std::string ModelSource::name() const { return file_ ? file_->name : config_->preset; }

}  // namespace dawnpiper
