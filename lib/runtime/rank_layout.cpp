#include "runtime/rank_layout.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "util/error.h"

namespace dawnpiper {

namespace {

void order_ranks_by_node(MPI_Comm world, RankLayout& l) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  MPI_Comm node;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int leader = rank;  // the node's lowest rank names the node
  MPI_Bcast(&leader, 1, MPI_INT, 0, node);
  MPI_Comm_free(&node);
  std::vector<int> leaders(static_cast<size_t>(size));
  MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, world);
  std::vector<int> order(static_cast<size_t>(size));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return leaders[a] < leaders[b]; });
  const int position = static_cast<int>(std::find(order.begin(), order.end(), rank) - order.begin());
  l.replica = position / l.stages;
  l.stage = position % l.stages;
  std::map<int, int> ranks_per_node;
  for (int n : leaders) ++ranks_per_node[n];
  l.nodes = static_cast<int>(ranks_per_node.size());
  for (const auto& [n, count] : ranks_per_node) l.pipelines_within_nodes &= count % l.stages == 0;
}

}  // namespace

RankLayout rank_layout(int stages, int replicas, MPI_Comm world) {
  int size = 1;
  MPI_Comm_size(world, &size);
  RankLayout l;
  // Without --stages each replica is a pipeline of ranks / D stages: D must divide the ranks.
  if (stages <= 0 && replicas > 0 && size % replicas != 0)
    throw ConfigError("--data-parallel " + std::to_string(replicas) + " needs a multiple of " +
                      std::to_string(replicas) + " MPI ranks (each replica a pipeline of ranks / " +
                      std::to_string(replicas) + " stages), but " + std::to_string(size) + " are launched");
  l.stages = stages > 0 ? stages : (replicas > 0 ? size / replicas : size);
  if (l.stages < 1) throw ConfigError("--stages must be at least 1");
  if (replicas > 0 && replicas * l.stages != size)
    throw ConfigError("--data-parallel " + std::to_string(replicas) + " x " + std::to_string(l.stages) +
                      " stages needs " + std::to_string(replicas * l.stages) + " MPI ranks, but " +
                      std::to_string(size) + " are launched");
  if (size % l.stages != 0)
    throw ConfigError("--stages " + std::to_string(l.stages) + " but " + std::to_string(size) +
                      " MPI ranks: launch with `mpirun -np " + std::to_string(l.stages) +
                      "` (or a multiple of it for data parallelism, or use --in-process)");
  l.replicas = size / l.stages;
  order_ranks_by_node(world, l);
  return l;
}

}  // namespace dawnpiper
