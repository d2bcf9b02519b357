// ZeRO levels 1 and 2's layout (runtime/zero_shard.h): the replicas' pieces tile every parameter once,
// buckets hold whole parameters, and each replica's shard is about 1/D of the stage.
#include "torch_test.h"

#include <vector>

#include "runtime/zero_shard.h"

using namespace dawnpiper;

TEST_CASE("ZeRO shards: the replicas' pieces cover every parameter element once", "[runtime][zero]") {
  const std::vector<int64_t> numels = {7, 1, 300, 5, 64, 2, 1000, 3};
  int64_t total = 0;
  for (int64_t n : numels) total += n;
  for (int replicas : {1, 2, 3, 4}) {
    for (int64_t bucket : {int64_t{1}, int64_t{16}, int64_t{100}, int64_t{1} << 20}) {
      std::vector<std::vector<int>> owners(numels.size());
      for (size_t p = 0; p < numels.size(); ++p) owners[p].assign(static_cast<size_t>(numels[p]), 0);
      int64_t shards = 0;
      for (int r = 0; r < replicas; ++r) {
        const ShardLayout l = shard_layout(numels, bucket, replicas, r);
        int64_t covered = 0;
        for (const ShardLayout::Piece& piece : l.pieces) {
          for (int64_t k = 0; k < piece.numel; ++k) ++owners[piece.param][static_cast<size_t>(piece.offset + k)];
          REQUIRE(piece.shard_offset >= 0);
          REQUIRE(piece.shard_offset + piece.numel <= l.shard_numel);
          covered += piece.numel;
        }
        // Each bucket starts at a parameter, holds whole ones, and reaches the bucket size unless last.
        for (size_t b = 0; b < l.buckets.size(); ++b) {
          const ShardLayout::Bucket& k = l.buckets[b];
          REQUIRE(k.begin == l.param_offset[k.first_param]);
          int64_t sum = 0;
          for (size_t p = k.first_param; p < k.end_param; ++p) sum += numels[p];
          REQUIRE(sum == k.numel);
          if (b + 1 < l.buckets.size()) REQUIRE(k.numel >= bucket);
          REQUIRE(k.chunk * replicas >= k.numel);
          REQUIRE(k.chunk * replicas < k.numel + replicas);
        }
        REQUIRE(covered <= l.shard_numel);
        shards += l.shard_numel;
      }
      for (const std::vector<int>& o : owners)
        for (int count : o) REQUIRE(count == 1);
      // The shards hold the stage and at most D - 1 padding elements per bucket.
      REQUIRE(shards >= total);
      REQUIRE(shards < total + static_cast<int64_t>(numels.size()) * replicas);
    }
  }
}

TEST_CASE("ZeRO shards: one replica owns everything, in one piece per parameter", "[runtime][zero]") {
  const ShardLayout l = shard_layout({4, 6, 8}, 1 << 20, 1, 0);
  REQUIRE(l.buckets.size() == 1);
  REQUIRE(l.pieces.size() == 3);
  REQUIRE(l.shard_numel == 18);
  REQUIRE(l.pieces[1].offset == 0);
  REQUIRE(l.pieces[1].shard_offset == 4);
}

TEST_CASE("ZeRO shards: with groups (level 2's nodes) a bucket closes only between two groups", "[runtime][zero]") {
  const std::vector<int64_t> numels = {64, 1, 64, 1, 300, 2, 5};
  const std::vector<int> groups = {0, 0, 1, 1, 2, 2, 3};
  for (int replicas : {1, 2, 3}) {
    for (int r = 0; r < replicas; ++r) {
      const ShardLayout l = shard_layout(numels, 50, replicas, r, groups);
      REQUIRE(l.buckets.size() == 4);  // {64, 1}, {64, 1}, {300, 2}, {5}
      for (const ShardLayout::Bucket& b : l.buckets) {
        if (b.first_param > 0) REQUIRE(groups[b.first_param] != groups[b.first_param - 1]);
        if (b.end_param < numels.size()) REQUIRE(groups[b.end_param] != groups[b.end_param - 1]);
      }
      // Each piece names the bucket whose chunk it lies in.
      for (const ShardLayout::Piece& piece : l.pieces) {
        const ShardLayout::Bucket& b = l.buckets.at(piece.bucket);
        REQUIRE(piece.param >= b.first_param);
        REQUIRE(piece.param < b.end_param);
        REQUIRE(piece.shard_offset >= b.shard_offset);
        REQUIRE(piece.shard_offset + piece.numel <= b.shard_offset + b.chunk);
      }
    }
  }
  // Without groups the same sizes close after a parameter: {64}, {1, 64}, {1, 300}, {2, 5}.
  REQUIRE(shard_layout(numels, 50, 2, 0).buckets.size() == 4);
  REQUIRE(shard_layout(numels, 50, 2, 0).buckets[0].end_param == 1);
}

TEST_CASE("ZeRO level 3: bf16 gathered into a bucket's upper half widens in place to its fp32 values",
          "[runtime][zero]") {
  // Blocks of every size down to one element, on the CPU and where there is one on a GPU (the NCCL
  // path widens there): no block's source overlaps its destination (ATen's copy refuses that).
  std::vector<c10::Device> devices = {at::kCPU};
  if (at::hasCUDA()) devices.emplace_back(at::kCUDA, 0);
  for (const c10::Device device : devices) {
    for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{7}, int64_t{1000}, int64_t{4097}, int64_t{65536}}) {
      const at::Tensor values = at::randn({n}).to(at::kBFloat16);
      at::Tensor bucket = at::full({n}, -1.0f, at::TensorOptions(at::kFloat).device(device));
      at::Tensor upper = at::empty({0}, at::TensorOptions(at::kBFloat16).device(device));
      upper.set_(bucket.storage(), n, {n}, {1});
      upper.copy_(values);
      widen_bf16_in_place(bucket.storage(), n, device);
      CAPTURE(n, device.str());
      REQUIRE(at::equal(bucket.cpu(), values.to(at::kFloat)));
    }
  }
}
