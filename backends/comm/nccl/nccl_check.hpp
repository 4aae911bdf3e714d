#pragma once
// The one place NCCL return codes become accel errors (CUDA runtime codes: cuda_check.hpp):
//   "ncclCommInitRankConfig(...) failed: unhandled system error (NCCL error code 2): <NCCL's
//    last error text> (nccl_communicator.cpp:88)"
//
// For code built against CUDA and NCCL only: it includes <nccl.h> and the CUDA runtime
// header, which the public communicator headers must not.

#include <nccl.h>

#include "foundation/cuda_check.hpp"

#include <string>

#include "foundation/error.hpp"

namespace accel::detail {

inline std::string nccl_error_text(ncclResult_t code) {
  std::string text = std::string(ncclGetErrorString(code)) + " (NCCL error code " +
                     std::to_string(static_cast<int>(code)) + ")";
  // NCCL keeps a per-thread description of what actually went wrong (which syscall, which
  // peer); it is often the only useful part.
  if (const char* last = ncclGetLastError(nullptr); last && *last) text += ": " + std::string(last);
  return text;
}

[[noreturn]] inline void throw_nccl_error(ncclResult_t code, const char* call, const char* file,
                                          int line) {
  throw CommError(
      with_location(std::string(call) + " failed: " + nccl_error_text(code), file, line));
}

}  // namespace accel::detail

// Runs an NCCL call; anything but ncclSuccess throws accel::CommError with file:line, the
// call text, the code, ncclGetErrorString and NCCL's last error message.
#define ACCEL_NCCL_CHECK(call)                                                      \
  do {                                                                              \
    const ncclResult_t accel_nccl_rc_ = (call);                                     \
    if (accel_nccl_rc_ != ncclSuccess)                                              \
      ::accel::detail::throw_nccl_error(accel_nccl_rc_, #call, __FILE__, __LINE__); \
  } while (0)

// The same for calls on a nonblocking communicator, which may also answer ncclInProgress
// ("accepted, still being carried out"); the caller then polls ncclCommGetAsyncError.
#define ACCEL_NCCL_CHECK_ASYNC(call)                                                \
  do {                                                                              \
    const ncclResult_t accel_nccl_rc_ = (call);                                     \
    if (accel_nccl_rc_ != ncclSuccess && accel_nccl_rc_ != ncclInProgress)          \
      ::accel::detail::throw_nccl_error(accel_nccl_rc_, #call, __FILE__, __LINE__); \
  } while (0)
