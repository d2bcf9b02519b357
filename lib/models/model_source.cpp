#include "models/model_source.h"

#include "util/error.h"

namespace dawnpiper {

ModelSource ModelSource::preset(const ModelConfig& config, Precision precision) {
  ModelSource s(config);
  s.precision_ = precision;
  return s;
}

ModelSource ModelSource::file(const std::string& path, const std::string& init_from,
                              std::optional<Precision> precision) {
  ModelSource s;
  s.file_ = read_model_file(path);
  s.init_from_ = init_from;
  s.precision_ = s.file_->precision;
  if (precision && *precision != s.file_->precision)
    throw ConfigError("model file '" + path + "' was exported in " + name_of(s.file_->precision) + ", not " +
                      name_of(*precision) + " (export it with scripts/export_model.py --precision " +
                      name_of(*precision) + ")");
  return s;
}

OpGraph ModelSource::graph(int64_t micro_batch_size) const {
  if (file_) return build_imported(*file_, micro_batch_size, init_from_);
  return build_model(*config_, micro_batch_size, precision_);
}

std::string ModelSource::name() const { return file_ ? file_->name : config_->preset; }

}  // namespace dawnpiper
