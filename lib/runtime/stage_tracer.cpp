#include "runtime/stage_tracer.h"

#include <ctime>

#include "memory/device_memory.h"

namespace dawnpiper {

namespace {
double process_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}
}  // namespace

StageTracer::StageTracer(c10::Device device, const Transport& transport, Clock::time_point origin, bool keep_records)
    : device_(device), transport_(transport), origin_(origin), keep_(keep_records) {}

void StageTracer::begin(int64_t step) {
  step_ = step;
  if (keep_) synchronize_current_stream(device_);
  DeviceMemory::reset_peak(device_);
  sent0_ = transport_.bytes_sent();
  received0_ = transport_.bytes_received();
  start_s_ = std::chrono::duration<double>(Clock::now() - origin_).count();
  start_cpu_s_ = process_cpu_s();
}

void StageTracer::end(const Action& action, int64_t step) {
  // On a GPU an action's kernels finish after it returns: a trace times the finished work
  // (which keeps the next action's kernels from overlapping this one's; untraced runs don't wait).
  // Only the compute stream's: swap copies on the side stream overlap the next actions as in an
  // untraced run, and a read that needs one waits inside the action that makes it.
  if (keep_) synchronize_current_stream(device_);
  ActionRecord r;
  r.end_s = std::chrono::duration<double>(Clock::now() - origin_).count();
  r.start_s = start_s_;
  r.cpu_s = process_cpu_s() - start_cpu_s_;
  r.stage = action.stage;
  r.kind = static_cast<int64_t>(action.kind);
  r.micro_batch = action.micro_batch;
  r.step = step;
  r.bytes_sent = transport_.bytes_sent() - sent0_;
  r.bytes_received = transport_.bytes_received() - received0_;
  r.live_bytes = DeviceMemory::live_bytes(device_);
  r.peak_bytes = DeviceMemory::peak_bytes(device_);
  peak_ = std::max(peak_, r.peak_bytes);
  step_peak_ = std::max(step_peak_, r.peak_bytes);
  last_end_s_ = r.end_s;
  if (keep_) records_.push_back(r);
}

void StageTracer::record_nested(int stage, ActionKind kind, int64_t micro_batch, int tensor, int64_t bytes,
                                Clock::time_point start, Clock::time_point end) {
  if (!keep_) return;
  ActionRecord r;
  r.stage = stage;
  r.kind = static_cast<int64_t>(kind);
  r.micro_batch = micro_batch;
  r.step = step_;
  r.start_s = std::chrono::duration<double>(start - origin_).count();
  r.end_s = std::chrono::duration<double>(end - origin_).count();
  r.live_bytes = DeviceMemory::live_bytes(device_);
  r.tensor = tensor;
  r.memopt_bytes = bytes;
  records_.push_back(r);
}

std::vector<ActionRecord> gather_records(const std::vector<ActionRecord>& mine, MPI_Comm comm, int root) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const int bytes = static_cast<int>(mine.size() * sizeof(ActionRecord));
  std::vector<int> counts(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
  MPI_Gather(&bytes, 1, MPI_INT, counts.data(), 1, MPI_INT, root, comm);
  std::vector<ActionRecord> all;
  if (rank == root) {
    int total = 0;
    for (int r = 0; r < size; ++r) offsets[r] = total, total += counts[r];
    all.resize(static_cast<size_t>(total) / sizeof(ActionRecord));
  }
  MPI_Gatherv(mine.data(), bytes, MPI_BYTE, all.data(), counts.data(), offsets.data(), MPI_BYTE, root, comm);
  return all;
}

}  // namespace dawnpiper
