#include "runtime/replica_link.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "runtime/mpi_transport.h"
#include "runtime/mpi_wait.h"
#include "util/units.h"

namespace dawnpiper {

std::string ReplicaLink::summary() const {
  char line[160];
  std::snprintf(line, sizeof line, "measured %s/s (a %s allreduce over %d replicas took %.2f ms)",
                format_bytes(bandwidth).c_str(), format_bytes(static_cast<double>(bytes)).c_str(), replicas,
                1e3 * seconds);
  return line;
}

ReplicaLink measure_replica_link(MPI_Comm world, int stage, int replicas, int64_t bucket_bytes) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Comm group = MPI_COMM_NULL;
  MPI_Comm_split(world, stage, rank, &group);
  constexpr int64_t kMiB = int64_t{1} << 20;
  const int64_t count = std::clamp(bucket_bytes, kMiB, 8 * kMiB) / static_cast<int64_t>(sizeof(float));
  std::vector<float> buffer(static_cast<size_t>(count), 1.0f);
  auto allreduce = [&] {
    allreduce_chunked_quietly(buffer.data(), count, MPI_FLOAT, MPI_SUM, group, kMessageChunkBytes);
  };
  allreduce();  // (the connections made)
  barrier_quietly(world);
  constexpr int kRepeats = 3;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRepeats; ++i) allreduce();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kRepeats;
  allreduce_quietly(&seconds, 1, MPI_DOUBLE, MPI_MAX, world);
  MPI_Comm_free(&group);
  ReplicaLink link;
  link.bytes = count * static_cast<int64_t>(sizeof(float));
  link.seconds = seconds;
  link.replicas = replicas;
  link.bandwidth = 2.0 * (replicas - 1) / replicas * static_cast<double>(link.bytes) / std::max(seconds, 1e-9);
  return link;
}

}  // namespace dawnpiper
