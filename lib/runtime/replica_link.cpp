#include "runtime/replica_link.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "runtime/mpi_transport.h"
#include "runtime/mpi_wait.h"
#include "runtime/replica_collectives.h"
#include "util/units.h"
#include "util/stopwatch.h"

namespace dawnpiper {

std::string ReplicaLink::summary() const {
  char line[320];
  const int n = std::snprintf(line, sizeof line, "measured %s/s (a %s allreduce over %d replicas took %.2f ms)",
                              format_bytes(bandwidth).c_str(), format_bytes(static_cast<double>(bytes)).c_str(),
                              replicas, 1e3 * seconds);
  if (drag >= 0 && n > 0 && n < static_cast<int>(sizeof line))
    std::snprintf(line + n, sizeof line - static_cast<size_t>(n),
                  "; a computing rank's work took %.2f ms longer per ms of a %s allreduce beside it", drag,
                  format_bytes(static_cast<double>(drag_bytes)).c_str());
  return line;
}

namespace {

double slowest(double seconds, MPI_Comm world) {
  allreduce_quietly(&seconds, 1, MPI_DOUBLE, MPI_MAX, world);
  return seconds;
}

// ReplicaLink::drag over the replicas in `group`, every rank of `world` at once, through the
// collectives level 0's buckets take (ReplicaCollectives::all_reduce in messages of
// kMessageChunkBytes). The work: small matrix products, the allreduce tested between them as
// the runtime tests between nodes.
double measure_drag(MPI_Comm world, MPI_Comm group, int64_t bytes) {
  const std::unique_ptr<ReplicaCollectives> collectives = make_replica_collectives(group, c10::Device(c10::kCPU));
  at::Tensor buffer = at::ones({bytes / static_cast<int64_t>(sizeof(float))});
  const at::Tensor a = at::rand({192, 192}), b = at::rand({192, 192});
  at::Tensor product = at::empty({192, 192});
  auto piece = [&] { at::mm_out(product, a, b); };
  auto allreduce = [&] { collectives->all_reduce(buffer, kMessageChunkBytes)->wait(); };
  allreduce();  // (the connections made)
  barrier_quietly(world);
  Stopwatch clock;
  allreduce();
  const double collective_s = slowest(clock.seconds(), world);
  clock.restart();
  for (int i = 0; i < 8; ++i) piece();
  const double piece_s = slowest(clock.seconds() / 8, world);
  // Work about three times the allreduce: room to hide all of it.
  const int pieces = static_cast<int>(std::clamp(std::ceil(3 * collective_s / std::max(piece_s, 1e-6)), 8.0, 4096.0));
  constexpr int kRounds = 5;
  std::vector<double> drags;
  for (int round = 0; round < kRounds; ++round) {
    barrier_quietly(world);
    clock.restart();
    allreduce();
    const double alone_s = clock.seconds();
    barrier_quietly(world);
    clock.restart();
    for (int i = 0; i < pieces; ++i) piece();
    const double work_s = clock.seconds();
    barrier_quietly(world);
    clock.restart();
    const std::unique_ptr<ReplicaCollective> flight = collectives->all_reduce(buffer, kMessageChunkBytes);
    for (int i = 0; i < pieces; ++i) piece(), flight->test();
    flight->wait();
    const double longer_s = slowest(clock.seconds() - work_s, world);
    drags.push_back(std::max(0.0, longer_s) / std::max(slowest(alone_s, world), 1e-9));
  }
  std::sort(drags.begin(), drags.end());
  return drags[drags.size() / 2];
}

}  // namespace

ReplicaLink measure_replica_link(MPI_Comm world, int stage, int replicas, int64_t bucket_bytes, c10::Device device) {
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
  const Stopwatch clock;
  for (int i = 0; i < kRepeats; ++i) allreduce();
  const double seconds = slowest(clock.seconds() / kRepeats, world);
  ReplicaLink link;
  link.bytes = count * static_cast<int64_t>(sizeof(float));
  link.seconds = seconds;
  link.replicas = replicas;
  link.bandwidth = 2.0 * (replicas - 1) / replicas * static_cast<double>(link.bytes) / std::max(seconds, 1e-9);
  // With 8 MiB whatever the bucket: a shorter allreduce drowns in the work's noise.
  if (device.is_cpu()) link.drag_bytes = 8 * kMiB, link.drag = measure_drag(world, group, link.drag_bytes);
  MPI_Comm_free(&group);
  return link;
}

}  // namespace dawnpiper
