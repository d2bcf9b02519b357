#include "runtime/mpi_wait.h"

#include <algorithm>
#include <thread>

namespace dawnpiper {

void wait_quietly(MPI_Request& request, MPI_Status* status) {
  int done = 0;
  // A few tests first: a message already on its way completes without any sleep.
  for (int i = 0; i < 16 && !done; ++i) MPI_Test(&request, &done, status);
  std::chrono::microseconds pause{2};
  while (!done) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, kMaxPause);
    MPI_Test(&request, &done, status);
  }
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

}  // namespace dawnpiper
