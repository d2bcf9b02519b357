#pragma once
// Stopping a run where a step ends, on a signal: SIGINT (Ctrl-C), SIGTERM (scancel, a time limit,
// mpirun passing on its own SIGINT or SIGTERM) and SIGUSR1/SIGUSR2 (what mpirun forwards as they
// are, and what Slurm's --signal sends ahead of a time limit). The handler only records the
// signal; the training loop asks at the end of every step, its ranks agree, and the run writes a
// checkpoint and exits with 128 + the signal, as a shell reports a process the signal ended. A
// second Ctrl-C ends the process at once.
namespace dawnpiper {

// Installs the handlers (again: no effect).
void install_stop_handlers();
// The first stop signal received, 0 if none.
int stop_signal();
// "SIGTERM", ...
const char* stop_signal_name(int signal);

}  // namespace dawnpiper
