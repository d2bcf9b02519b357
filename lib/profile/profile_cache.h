#pragma once
// Measured profiles kept on disk, so that `train` measures a model once per machine setup instead
// of on every run (and plans from the same numbers every time). The key covers what changes the
// numbers: the graph (operators, parameters, precision and every tensor's shape, hence the
// micro-batch size and sequence length), the device, the intra-op thread count, the profiler's
// settings and the dawnpiper binary itself (a rebuilt binary measures afresh).
#include <optional>
#include <string>

#include "graph/op_graph.h"
#include "profile/profile.h"

namespace dawnpiper {

// The cache directory for an option value: "off" -> "" (no cache); "" -> $DAWNPIPER_CACHE if
// set (itself possibly "off"), else $XDG_CACHE_HOME/dawnpiper, else $HOME/.cache/dawnpiper.
std::string profile_cache_dir(const std::string& option);

// The file a profile of `graph` measured under `settings` (device, threads, profiler options as
// text) is kept in: DIR/profile-<hash>.h5.
std::string profile_cache_path(const std::string& dir, const OpGraph& graph, const std::string& settings);

// The cached profile, if the file is there and readable and is of this graph; a damaged file is
// ignored (it is measured again and replaced).
std::optional<Profile> read_cached_profile(const std::string& path, const OpGraph& graph);

// Writes atomically; returns false (and leaves no file) when the directory cannot be written.
bool write_cached_profile(const std::string& path, const Profile& profile);

}  // namespace dawnpiper
