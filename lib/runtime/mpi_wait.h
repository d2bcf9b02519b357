#pragma once
// Waiting on MPI without holding a core. Open MPI's blocking calls poll in a busy loop (with
// more ranks than cores, a sched_yield loop), so a rank waiting for its neighbour takes the CPU
// time that a rank sharing its core, or its own intra-op threads, would compute with. These
// test the request and sleep between tests, the pause doubling from 2 us up to kMaxPause: a long
// wait costs almost no CPU. The latency added is about one pause per test that finds a transfer
// step done (Linux's timer slack makes the shortest sleeps about 50 us); a rendezvous transfer
// has a few such steps (docs/benchmarks.md, "Waiting without spinning").
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dawnpiper {

inline constexpr std::chrono::microseconds kMaxPause{200};

// MPI_Wait, sleeping between tests.
void wait_quietly(MPI_Request& request, MPI_Status* status = MPI_STATUS_IGNORE);
// MPI_Waitall the same way, except that the pause starts again from its shortest whenever a
// request completed: while the parts of a message split into several (MpiTransport's chunks)
// keep arriving, the wait tests at once. Without a shared-memory single copy, Open MPI moves a
// large message in fragments that need both ranks to enter MPI, and sleeping 200 us between
// tests cut a 24 MiB transfer to 0.34 GB/s (docs/gpu.md).
// `statuses`, when given, receives each request's status at its index.
void wait_all_quietly(std::vector<MPI_Request>& requests, std::vector<MPI_Status>* statuses = nullptr);

// MPI_Recv as MPI_Irecv and wait_quietly.
void recv_quietly(void* buffer, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, MPI_Status* status);

// MPI_Allreduce in place as MPI_Iallreduce and wait_quietly.
void allreduce_quietly(void* buffer, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm);

// The same over a large buffer, as one MPI_Iallreduce per `chunk_bytes` (all posted at once, in
// order) and wait_all_quietly: Open MPI's non-blocking collectives advance only inside MPI calls,
// and a whole 147 MiB allreduce (GPT-2's tied embedding gradient) between two ranks sharing a GPU
// took 0.37-1.46 s behind the sleeping wait (docs/gpu.md).
void allreduce_chunked_quietly(void* buffer, int64_t count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                               int64_t chunk_bytes);

// MPI_Bcast as MPI_Ibcast and wait_quietly: the ranks that wait while rank 0 profiles and plans.
void broadcast_quietly(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm);

// A string from `root` to every rank (its length, then its bytes), each broadcast_quietly.
void broadcast_string_quietly(std::string& text, int root, MPI_Comm comm);

// Every rank's bytes at rank 0 of `comm`, in rank order (the others get ""): their sizes, then
// the bytes, each gathered as MPI_Igather(v) and wait_quietly.
std::string gather_string_quietly(const std::string& mine, MPI_Comm comm);

// MPI_Barrier as MPI_Ibarrier and wait_quietly.
void barrier_quietly(MPI_Comm comm);

// Whether any of `requests` has not been seen complete.
bool any_in_flight(const std::vector<MPI_Request>& requests);

// Keeps `buffers` allocated until the process ends. For an owner that unwinds (this rank failed)
// while MPI still reads or writes them: a collective cannot be cancelled, and waiting could hang
// on a peer that never joins; freed, the next MPI call that advances the transfer writes into
// freed memory (a segfault in Open MPI's TCP receive instead of the job's one error). The job
// ends soon after, so nothing needs reclaiming.
template <class Buffers>
void keep_until_exit(Buffers buffers) {
  static_cast<void>(new Buffers(std::move(buffers)));
}

}  // namespace dawnpiper
