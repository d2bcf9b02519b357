#pragma once
// Elapsed wall time on the monotonic clock, from construction or the last restart.
#include <chrono>

namespace dawnpiper {

class Stopwatch {
 public:
  using Clock = std::chrono::steady_clock;
  Stopwatch() : start_(Clock::now()) {}
  void restart() { start_ = Clock::now(); }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  double ms() const { return std::chrono::duration<double, std::milli>(Clock::now() - start_).count(); }

 private:
  Clock::time_point start_;
};

}  // namespace dawnpiper
