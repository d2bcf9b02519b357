#pragma once
// Shared by the import tests: where the exported test models are (the ctest fixture
// "exported models" writes them with tests/import/export_test_models.py) and reading tensors
// from their eager references.
#include <cstdlib>
#include <string>

#include "torch_test.h"

#include "data/scalar_type.h"
#include "util/safetensors.h"

namespace dawnpiper::test {

// The build's test-models directory (CMake), unless DAWNPIPER_TEST_MODELS names another.
inline std::string test_models_dir() {
  const char* dir = std::getenv("DAWNPIPER_TEST_MODELS");
  return dir ? dir : DP_TEST_MODELS;
}

inline std::string test_model(const std::string& name) { return test_models_dir() + "/" + name + ".dpm"; }

inline at::Tensor read_tensor(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsEntry& e = file.entry(name);
  return at::from_blob(const_cast<void*>(file.data(e)), e.shape, at::TensorOptions(scalar_type(e.dtype))).clone();
}

// ||a - b|| / ||b||, or ||a - b|| where b is all zeros.
inline double relative_error(const at::Tensor& a, const at::Tensor& b) {
  const double diff = (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>();
  const double norm = b.to(at::kDouble).norm().item<double>();
  return norm > 0 ? diff / norm : diff;
}

}  // namespace dawnpiper::test
