#pragma once
// The one place CUDA runtime return codes become accel errors:
//   "cudaStreamCreateWithFlags(...) failed: cudaErrorNoDevice: no CUDA-capable device is
//    detected (CUDA error code 100) (nccl_communicator.cpp:120)"
//
// For code built against the CUDA runtime only (device_memory.cpp, the NCCL communicator):
// it includes the CUDA runtime header, which public headers must not.

#include <cuda_runtime_api.h>

#include <string>

#include "foundation/error.hpp"

namespace accel::detail {

inline std::string cuda_error_text(cudaError_t code) {
  return std::string(cudaGetErrorName(code)) + ": " + cudaGetErrorString(code) +
         " (CUDA error code " + std::to_string(static_cast<int>(code)) + ")";
}

[[noreturn]] inline void throw_cuda_error(cudaError_t code, const char* call, const char* file,
                                          int line) {
  throw CommError(
      with_location(std::string(call) + " failed: " + cuda_error_text(code), file, line));
}

}  // namespace accel::detail

// Runs a CUDA runtime call; anything but cudaSuccess throws accel::CommError with file:line,
// the call text, the code and cudaGetErrorName / cudaGetErrorString.
#define ACCEL_CUDA_CHECK(call)                                                      \
  do {                                                                              \
    const cudaError_t accel_cuda_rc_ = (call);                                      \
    if (accel_cuda_rc_ != cudaSuccess)                                              \
      ::accel::detail::throw_cuda_error(accel_cuda_rc_, #call, __FILE__, __LINE__); \
  } while (0)
