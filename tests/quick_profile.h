#pragma once
// One untimed isolated run per node: what the tests need of a profile is its structure, bytes
// and layouts, not its times.
#include "profile/profiler.h"

namespace dawnpiper::test {

inline ProfilerOptions quick_profiler_options() {
  ProfilerOptions quick;
  quick.warmup = 0;
  quick.iterations = 1;
  quick.in_step_timing = false;
  return quick;
}

inline Profile quick_profile(const OpGraph& g) { return profile_graph(g, quick_profiler_options()); }

}  // namespace dawnpiper::test
