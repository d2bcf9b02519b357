#pragma once
// What the checkpoint's writer, checker and reader share (runtime/checkpoint.h): where a
// step's files are, their checksums, and which slices of the parameters a stage's optimizer
// state covers.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/pipeline_stage.h"

namespace dawnpiper::checkpoint_files {

std::string step_dir(const std::string& dir, int64_t step);
std::string manifest_path(const std::string& dir, int64_t step);
// stage-<x>.h5, or under ZeRO stage-<x>-replica-<r>.h5 for replica r > 0.
std::string stage_file(const std::string& dir, int64_t step, int stage, int replica = 0);

// The sharding a stage's optimizer state has: ZeRO's level and replica count, or 0 and 1.
std::pair<int64_t, int64_t> sharding_of(PipelineStage& stage);

// A file's size and a 64-bit checksum of its bytes (words multiplied and mixed: several GB/s,
// enough to tell a damaged file from the one written). Size -1: it cannot be read.
struct FileSum {
  int64_t bytes = -1;
  uint64_t sum = 0;
};
FileSum file_sum(const std::string& path);
std::string hex(uint64_t v);

// The step numbers of DIR's step-<k> directories, newest first.
std::vector<int64_t> step_directories(const std::string& dir);
// Whether step k has its manifest (the mark of a complete checkpoint).
bool is_complete(const std::string& dir, int64_t step);

// The tensors the stage's optimizer updates (optimizer().params(), whose state is state()'s, the
// moments one after another) as slices of its parameters' flattened elements: below ZeRO level 1
// each whole parameter, at levels 1-3 the pieces of the replica's shard.
struct StateOwner {
  size_t param = 0;
  int64_t offset = 0, numel = 0;
};
std::vector<StateOwner> state_owners(PipelineStage& stage);

}  // namespace dawnpiper::checkpoint_files
