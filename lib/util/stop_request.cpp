#include "util/stop_request.h"

#include <csignal>
#include <initializer_list>

namespace dawnpiper {

namespace {
volatile std::sig_atomic_t received = 0;

extern "C" void on_stop_signal(int signal) {
  if (received == 0) received = signal;
}
}  // namespace

void install_stop_handlers() {
  struct sigaction action = {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signal : {SIGTERM, SIGUSR1, SIGUSR2}) sigaction(signal, &action, nullptr);
  action.sa_flags = SA_RESTART | SA_RESETHAND;  // the second Ctrl-C is the default's: the end
  sigaction(SIGINT, &action, nullptr);
}

int stop_signal() { return received; }

const char* stop_signal_name(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    default:
      return "a signal";
  }
}

}  // namespace dawnpiper
