#include "runtime/mpi_wait.h"

#include <algorithm>
#include <thread>

namespace dawnpiper {

void wait_quietly(MPI_Request& request, MPI_Status* status) {
  std::vector<MPI_Request> one{request};
  std::vector<MPI_Status> statuses;
  wait_all_quietly(one, status == MPI_STATUS_IGNORE ? nullptr : &statuses);
  request = one.front();
  if (status != MPI_STATUS_IGNORE) *status = statuses.front();
}

void wait_all_quietly(std::vector<MPI_Request>& requests, std::vector<MPI_Status>* statuses) {
  std::vector<int> done(requests.size());
  std::vector<MPI_Status> found(statuses ? requests.size() : 0);
  if (statuses) statuses->resize(requests.size());
  size_t left = 0;
  for (const MPI_Request& r : requests) left += r != MPI_REQUEST_NULL;
  std::chrono::microseconds pause{2};
  int tests_without_progress = 0;
  while (left > 0) {
    int count = 0;
    MPI_Testsome(static_cast<int>(requests.size()), requests.data(), &count, done.data(),
                 statuses ? found.data() : MPI_STATUSES_IGNORE);
    if (count == MPI_UNDEFINED) break;  // none active
    if (count > 0) {
      for (int k = 0; statuses && k < count; ++k)
        (*statuses)[static_cast<size_t>(done[static_cast<size_t>(k)])] = found[static_cast<size_t>(k)];
      left -= static_cast<size_t>(count);
      pause = std::chrono::microseconds{2};
      tests_without_progress = 0;
      continue;
    }
    if (++tests_without_progress < 16) continue;  // a message already on its way needs no sleep
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, kMaxPause);
  }
}

bool any_in_flight(const std::vector<MPI_Request>& requests) {
  return std::any_of(requests.begin(), requests.end(), [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
}

void recv_quietly(void* buffer, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, MPI_Status* status) {
  MPI_Request request;
  MPI_Irecv(buffer, count, type, source, tag, comm, &request);
  wait_quietly(request, status);
}

void allreduce_quietly(void* buffer, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  MPI_Request request;
  MPI_Iallreduce(MPI_IN_PLACE, buffer, count, type, op, comm, &request);
  wait_quietly(request);
}

void allreduce_chunked_quietly(void* buffer, int64_t count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                               int64_t chunk_bytes) {
  int size = 0;
  MPI_Type_size(type, &size);
  const int64_t per_chunk = std::max<int64_t>(1, chunk_bytes / std::max(size, 1));
  std::vector<MPI_Request> requests;
  for (int64_t offset = 0; offset < count; offset += per_chunk) {
    requests.emplace_back();
    MPI_Iallreduce(MPI_IN_PLACE, static_cast<char*>(buffer) + offset * size,
                   static_cast<int>(std::min(per_chunk, count - offset)), type, op, comm, &requests.back());
  }
  wait_all_quietly(requests);
}

void broadcast_quietly(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm) {
  MPI_Request request;
  MPI_Ibcast(buffer, count, type, root, comm, &request);
  wait_quietly(request);
}

void barrier_quietly(MPI_Comm comm) {
  MPI_Request request;
  MPI_Ibarrier(comm, &request);
  wait_quietly(request);
}

void broadcast_string_quietly(std::string& text, int root, MPI_Comm comm) {
  int64_t n = static_cast<int64_t>(text.size());
  broadcast_quietly(&n, 1, MPI_INT64_T, root, comm);
  text.resize(static_cast<size_t>(n));
  broadcast_quietly(text.data(), static_cast<int>(n), MPI_CHAR, root, comm);
}

std::string gather_string_quietly(const std::string& mine, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const int n = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
  MPI_Request request;
  MPI_Igather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, comm, &request);
  wait_quietly(request);
  std::string all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < size; ++r) offsets[static_cast<size_t>(r)] = total, total += counts[static_cast<size_t>(r)];
    all.resize(static_cast<size_t>(total));
  }
  MPI_Igatherv(mine.data(), n, MPI_BYTE, all.data(), counts.data(), offsets.data(), MPI_BYTE, 0, comm, &request);
  wait_quietly(request);
  return all;
}

}  // namespace dawnpiper
