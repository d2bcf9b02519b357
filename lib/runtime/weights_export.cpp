#include "runtime/weights_export.h"

#include <ATen/core/grad_mode.h>

#include <cstring>
#include <map>

#include "data/scalar_type.h"
#include "runtime/mpi_wait.h"
#include "util/safetensors.h"

namespace dawnpiper {

namespace {

// One rank's parameters as bytes: per tensor its name, dtype, shape and data.
std::string pack(const std::vector<StageParameter>& parameters) {
  at::NoGradGuard no_grad;
  std::string out;
  auto put = [&out](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
  for (const StageParameter& p : parameters) {
    const at::Tensor t = p.tensor.detach().to(at::kCPU).contiguous();
    const int64_t name_len = static_cast<int64_t>(p.name.size()), dims = t.dim();
    const int64_t dtype = static_cast<int64_t>(dtype_of(t.scalar_type()));
    const int64_t bytes = t.numel() * t.element_size();
    put(&name_len, 8), put(p.name.data(), p.name.size()), put(&dtype, 8), put(&dims, 8);
    for (int64_t d : t.sizes()) put(&d, 8);
    put(&bytes, 8), put(t.data_ptr(), static_cast<size_t>(bytes));
  }
  return out;
}

}  // namespace

void save_weights(const std::vector<StageParameter>& parameters, const std::string& path, MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const std::string all = gather_string_quietly(pack(parameters), comm);
  if (rank != 0) return;
  std::vector<SafetensorsTensor> tensors;
  std::map<std::string, bool> seen;
  size_t at = 0;
  auto get = [&](void* p, size_t k) { std::memcpy(p, all.data() + at, k), at += k; };
  while (at < all.size()) {
    int64_t name_len = 0, dtype = 0, dims = 0, bytes = 0;
    get(&name_len, 8);
    std::string name(all.data() + at, static_cast<size_t>(name_len));
    at += static_cast<size_t>(name_len);
    get(&dtype, 8), get(&dims, 8);
    SafetensorsTensor t;
    t.name = name;
    t.dtype = static_cast<DType>(dtype);
    t.shape.resize(static_cast<size_t>(dims));
    for (int64_t& d : t.shape) get(&d, 8);
    get(&bytes, 8);
    t.data = all.data() + at;
    at += static_cast<size_t>(bytes);
    if (seen.emplace(name, true).second) tensors.push_back(std::move(t));  // ranks in stage order
  }
  write_safetensors(path, tensors, {{"format", "pt"}});
}

}  // namespace dawnpiper
