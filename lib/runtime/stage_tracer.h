#pragma once
// StageTracer: times every action a stage executes and reads the device memory around it (the
// counting allocator on CPU, the CUDA caching allocator on GPU), for traces and for the stage's
// measured peak. Times are seconds since a common origin every rank takes right after a barrier.
#include <mpi.h>

#include <chrono>
#include <utility>
#include <vector>

#include <c10/core/Device.h>

#include "runtime/transport.h"
#include "schedule/action.h"
#include "trace/trace.h"

namespace dawnpiper {

class StageTracer {
 public:
  using Clock = std::chrono::steady_clock;
  // Records carry each action's stage (a rank may run several).
  StageTracer(c10::Device device, const Transport& transport, Clock::time_point origin, bool keep_records);

  // Runs `work` (executing `action` of training step `step`) and records it.
  template <typename F>
  void run(const Action& action, int64_t step, F&& work) {
    begin(step);
    work();
    end(action, step);
  }

  // An evictor record inside the action now running on `stage` (Evictor::Listener's arguments).
  void record_nested(int stage, ActionKind kind, int64_t micro_batch, int tensor, int64_t bytes,
                     Clock::time_point start, Clock::time_point end);

  const std::vector<ActionRecord>& records() const { return records_; }
  int64_t peak_bytes() const { return peak_; }
  // The peak since the previous call (or the start): a step's, called where a step ends.
  int64_t take_step_peak() { return std::exchange(step_peak_, 0); }
  double last_end_s() const { return last_end_s_; }

 private:
  void begin(int64_t step);
  void end(const Action& action, int64_t step);

  c10::Device device_;
  const Transport& transport_;
  Clock::time_point origin_;
  bool keep_;
  std::vector<ActionRecord> records_;
  int64_t peak_ = 0, step_peak_ = 0;
  double start_s_ = 0, start_cpu_s_ = 0, last_end_s_ = 0;
  int64_t step_ = 0;
  int64_t sent0_ = 0, received0_ = 0;
};

// Every rank's records, in rank order, on `root`; an empty list elsewhere.
std::vector<ActionRecord> gather_records(const std::vector<ActionRecord>& mine, MPI_Comm comm, int root = 0);

}  // namespace dawnpiper
