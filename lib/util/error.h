#pragma once
// Errors a user can cause. main() catches dawnpiper::Error, prints what() as one line and exits
// with exit_code(); anything else escaping is a bug and is reported as such.
#include <stdexcept>
#include <string>

namespace dawnpiper {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, int exit_code = 2) : std::runtime_error(what), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// Bad configuration: unknown model, inconsistent overrides, unknown option, unreadable file.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& reason) : Error("configuration error: " + reason, 2), reason_(reason) {}
  const std::string& reason() const { return reason_; }  // what() without the prefix

 private:
  std::string reason_;
};

// A device (real or the counting CPU allocator's budget) could not satisfy an allocation.
class OutOfMemoryError : public Error {
 public:
  explicit OutOfMemoryError(const std::string& what) : Error("out of memory: " + what, 3) {}
};

// No plan satisfies the constraints (capacity, stages, batch size).
class InfeasibleError : public Error {
 public:
  explicit InfeasibleError(const std::string& what) : Error("no feasible plan: " + what, 4) {}
};

}  // namespace dawnpiper
