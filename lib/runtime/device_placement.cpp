#include "runtime/device_placement.h"

#include <sched.h>
#include <unistd.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstdio>
#include <cstring>

#include "memory/device_memory.h"
#include "util/error.h"
#include "util/units.h"

#ifdef DAWNPIPER_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

namespace dawnpiper {

int node_local_rank(MPI_Comm comm) {
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int rank = 0;
  MPI_Comm_rank(node, &rank);
  MPI_Comm_free(&node);
  return rank;
}

c10::Device rank_device(c10::Device requested, MPI_Comm comm) {
  const int local = node_local_rank(comm);  // collective: every rank calls it
  if (!requested.is_cuda()) return requested;
#ifdef DAWNPIPER_CUDA
  // Every rank learns which ranks see no GPU, so that all of them fail with the same one line.
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const int gpus = cuda_available() ? static_cast<int>(c10::cuda::device_count()) : 0;
  std::vector<int> all(static_cast<size_t>(size));
  MPI_Allgather(&gpus, 1, MPI_INT, all.data(), 1, MPI_INT, comm);
  std::string blind;
  int blind_count = 0;
  for (int r = 0; r < size; ++r)
    if (all[static_cast<size_t>(r)] < 1) blind += (blind_count++ ? ", " : "") + std::to_string(r);
  if (blind_count > 0)
    throw ConfigError("--device cuda: no GPU is visible to rank" + std::string(blind_count > 1 ? "s " : " ") + blind +
                      " (of " + std::to_string(size) + "); use --device cpu, or launch where GPUs are");
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(local % gpus));
  c10::cuda::set_device(device.index());
  // The caching allocator exists from here on: its statistics and memory fraction are read
  // before this rank's first CUDA tensor (a stage that received nothing yet, a cached profile).
  DeviceMemory::initialize(device);
  return device;
#else
  throw ConfigError("--device cuda: this build has no CUDA support");
#endif
}

std::vector<std::string> device_identities(c10::Device device, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  constexpr size_t kLength = 128;
  std::array<char, kLength> mine{};
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  std::string id = std::string(host) + "/cpu-rank-" + std::to_string(rank);
#ifdef DAWNPIPER_CUDA
  if (device.is_cuda()) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device.index()) != cudaSuccess)
      throw Error("cannot read the properties of GPU " + std::to_string(device.index()));
    char uuid[2 * sizeof prop.uuid.bytes + 1] = {};
    for (size_t i = 0; i < sizeof prop.uuid.bytes; ++i)
      std::snprintf(uuid + 2 * i, 3, "%02x", static_cast<unsigned char>(prop.uuid.bytes[i]));
    id = std::string(host) + "/gpu-" + uuid;
  }
#endif
  std::strncpy(mine.data(), id.c_str(), kLength - 1);
  std::vector<char> all(kLength * static_cast<size_t>(size));
  MPI_Allgather(mine.data(), static_cast<int>(kLength), MPI_CHAR, all.data(), static_cast<int>(kLength), MPI_CHAR,
                comm);
  std::vector<std::string> ids;
  for (int r = 0; r < size; ++r) ids.emplace_back(all.data() + kLength * static_cast<size_t>(r));
  return ids;
}

DeviceBudget default_device_memory(c10::Device device, MPI_Comm comm) {
  if (!device.is_cuda()) return {kUnlimitedBytes, ""};
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const std::vector<std::string> ids = device_identities(device, comm);
  const auto sharing = std::count(ids.begin(), ids.end(), ids[static_cast<size_t>(rank)]);
  DeviceMemory::free_bytes(device);  // every context first: each takes its share of the free memory
  MPI_Barrier(comm);
  const int64_t free_bytes = DeviceMemory::free_bytes(device);
  const int64_t mine = free_bytes / sharing - kCudaLazyLoadBytes;
  int64_t least = mine;
  MPI_Allreduce(&mine, &least, 1, MPI_INT64_T, MPI_MIN, comm);
  const std::string split = sharing > 1 ? " / " + std::to_string(sharing) + " ranks" : "";
  if (least <= 0)
    throw ConfigError("--device cuda: a GPU has " + format_bytes(static_cast<double>(least + kCudaLazyLoadBytes)) +
                      " free per rank that shares it, too little to train in; free the GPU or launch fewer ranks "
                      "per GPU");
  DeviceBudget budget;
  budget.bytes = least;
  budget.why = "the GPU's free memory" + split + " less " + format_bytes(static_cast<double>(kCudaLazyLoadBytes)) +
               " for CUDA's own use (--device-memory sets it)";
  return budget;
}

}  // namespace dawnpiper

namespace dawnpiper {

ThreadCount choose_threads(int requested, MPI_Comm comm) {
  MPI_Comm node;
  int rank = 0, ranks_on_node = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &ranks_on_node);
  MPI_Comm_free(&node);
  ThreadCount c;
  const char* env = std::getenv("OMP_NUM_THREADS");
  if (requested > 0) {
    c.threads = requested;
    c.why = "--threads";
  } else if (env && std::atoi(env) > 0) {
    c.threads = std::atoi(env);
    c.why = "OMP_NUM_THREADS";
  } else {
    const int cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    cpu_set_t mine;
    const int allowed = sched_getaffinity(0, sizeof mine, &mine) == 0 ? CPU_COUNT(&mine) : cores;
    c.threads = std::max(1, std::min(allowed, cores / ranks_on_node));
    c.why = std::to_string(cores) + (cores == 1 ? " core / " : " cores / ") + std::to_string(ranks_on_node) +
            (ranks_on_node == 1 ? " rank" : " ranks") + " on the node";
  }
  at::set_num_threads(c.threads);
  return c;
}

}  // namespace dawnpiper
