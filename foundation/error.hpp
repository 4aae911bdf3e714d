#pragma once
// One error model for the whole library: the public API throws accel::Error subclasses.
// C return codes (MPI, NCCL, CUDA, errno) are converted once, at the call site's checking
// macro, into one of these with file:line and both the code and its text.

#include <stdexcept>
#include <string>

namespace accel {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed something the operation cannot work with (mismatched counts, bad rank).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// Something did not happen within its deadline. The message names who was waited for.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// The rendezvous store failed: unreachable, refused, or a protocol error.
class StoreError : public Error {
 public:
  using Error::Error;
};

// A collective or point-to-point operation failed (peer gone, library error).
class CommError : public Error {
 public:
  using Error::Error;
};

// A config file, flag or environment variable has a bad value.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A checkpoint that cannot be written, found, read or trusted. The message names the file
// and what is wrong with it.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// An accel::Error that escapes a program's main() ends it with exit code 1 and one line on
// stderr, "[rank R] uncaught KIND: MESSAGE" (accelerate/process/uncaught_error.hpp); the launcher's
// failure report quotes it. This is the part of the line both look for.
inline constexpr const char* kUncaughtTag = "] uncaught ";

// "what (file:line)" for the checking macros.
std::string with_location(const std::string& what, const char* file, int line);

// Throws InvalidArgument with the location of the check when cond is false.
#define ACCEL_CHECK_ARG(cond, message)                                                     \
  do {                                                                                     \
    if (!(cond))                                                                           \
      throw ::accel::InvalidArgument(::accel::with_location(message, __FILE__, __LINE__)); \
  } while (0)

// Converts a failed POSIX call (returning -1 and setting errno) into CommError.
std::string errno_text(int err);

}  // namespace accel
