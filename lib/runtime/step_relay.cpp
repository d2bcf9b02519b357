#include "runtime/step_relay.h"

#include "runtime/mpi_wait.h"
#include "train/lr_schedule.h"

namespace dawnpiper {

StepRelay::StepRelay(const PipelineConfig& c, const RunConfig& options, MPI_Comm control, int rank, int stages)
    : c_(c),
      options_(options),
      control_(control),
      rank_(rank),
      stages_(stages),
      reported_(c.first_step),
      end_(c.steps) {
  if (rank_ != 0) outgoing_.reserve(static_cast<size_t>(c.steps - c.first_step));  // kept alive for the Isends
}

StepRelay::~StepRelay() {
  if (any_in_flight(requests_)) keep_until_exit(std::move(outgoing_));  // (an error unwinds the run)
}

void StepRelay::send(int64_t step, int64_t peak_bytes, double loss, double grad_norm) {
  if (rank_ == stages_ - 1 && c_.replicas > 1) {
    allreduce_quietly(&loss, 1, MPI_DOUBLE, MPI_SUM, options_.replica_comm);
    loss /= static_cast<double>(c_.replicas);
  }
  if (rank_ == 0) {
    Pending& p = pending_[step];
    p.report.grad_norm = grad_norm;
    p.report.peak_bytes.resize(static_cast<size_t>(stages_));
    p.report.peak_bytes[0] = peak_bytes;
    if (stages_ == 1) p.report.loss = loss;
    ++p.records;
    return;
  }
  outgoing_.push_back({loss, static_cast<double>(peak_bytes)});
  requests_.emplace_back();
  MPI_Isend(outgoing_.back().data(), 2, MPI_DOUBLE, 0, static_cast<int>(step), control_, &requests_.back());
}

void StepRelay::poll(int64_t wait_through) {
  if (rank_ != 0) return;
  while (reported_ < end_) {
    const bool wait = reported_ <= wait_through;
    Pending& p = pending_[reported_];
    p.report.peak_bytes.resize(static_cast<size_t>(stages_));
    p.arrived.resize(static_cast<size_t>(stages_));
    for (int from = 1; from < stages_; ++from) {
      if (p.arrived[from]) continue;
      int flag = 1;
      if (!wait) MPI_Iprobe(from, static_cast<int>(reported_), control_, &flag, MPI_STATUS_IGNORE);
      if (!flag) continue;
      std::array<double, 2> record{};
      recv_quietly(record.data(), 2, MPI_DOUBLE, from, static_cast<int>(reported_), control_, MPI_STATUS_IGNORE);
      if (from == stages_ - 1) p.report.loss = record[0];
      p.report.peak_bytes[from] = static_cast<int64_t>(record[1]);
      p.arrived[from] = true;
      ++p.records;
    }
    if (p.records < stages_) return;  // rank 0's own record is there for every step it waits for
    p.report.step = reported_;
    p.report.lr = scheduled_lr(c_.optimizer.lr, c_.optimizer.schedule, reported_);
    if (options_.on_loss) options_.on_loss(p.report);
    pending_.erase(reported_++);
  }
}

void StepRelay::finish(int64_t end) {
  end_ = end;
  poll(end - 1);
  for (MPI_Request& r : requests_) wait_quietly(r);
}

}  // namespace dawnpiper
