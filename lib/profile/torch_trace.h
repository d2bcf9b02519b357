#pragma once

#include <cstdint>
#include <string>

namespace dawnpiper {

// `train --torch-trace FILE`: PyTorch's own profiler (Kineto: CPU operators and, on CUDA, every
// kernel and copy) on rank 0 over a window of steps, written as a Chrome trace that Perfetto and
// chrome://tracing read. Steps `first` .. `first + count - 1` are traced (after the warm-up, which
// allocates and tunes); nothing happens where the path is empty.
class TorchTrace {
 public:
  TorchTrace(std::string path, int64_t first = 2, int64_t count = 2);
  ~TorchTrace();
  TorchTrace(const TorchTrace&) = delete;
  TorchTrace& operator=(const TorchTrace&) = delete;

  // Called where each step has finished: starts the profiler after step `first - 1`, stops it
  // and writes the file after step `first + count - 1`.
  void step_finished(int64_t step);
  // Where the run ended early: writes what was traced.
  void finish();

 private:
  std::string path_;
  int64_t first_, count_;
  bool on_ = false;
};

}  // namespace dawnpiper
