#pragma once
// The one place MPI return codes become accel errors. Every MPI call the MPI communicator
// makes goes through ACCEL_MPI_CHECK, so a failure reads
//   "MPI_Iallreduce(...) failed: MPI_ERR_TRUNCATE: message truncated (MPI error code 15)
//    (mpi_communicator.cpp:123)"
// This only works on communicators whose error handler is MPI_ERRORS_RETURN; under MPI's
// default (MPI_ERRORS_ARE_FATAL) a failing call aborts the job before returning a code.
//
// Private to the MPI backend: it includes <mpi.h>, which the public headers must not.

// The C API is all we use; keep OpenMPI and MPICH from pulling in their (deprecated) C++
// bindings, which would need libmpi_cxx at link time.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <string>

#include "foundation/error.hpp"

namespace accel::detail {

// MPI_Error_string may be called at any time, even after MPI_Finalize (MPI-4), so this is
// safe on every error path.
inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(text, static_cast<std::size_t>(length));
}

[[noreturn]] inline void throw_mpi_error(int code, const char* call, const char* file, int line) {
  throw CommError(with_location(std::string(call) + " failed: " + mpi_error_text(code) +
                                    " (MPI error code " + std::to_string(code) + ")",
                                file, line));
}

}  // namespace accel::detail

// Runs an MPI call and throws accel::CommError with file:line, the call text, the code and
// MPI's text for it when the call does not return MPI_SUCCESS.
#define ACCEL_MPI_CHECK(call)                                                     \
  do {                                                                            \
    const int accel_mpi_rc_ = (call);                                             \
    if (accel_mpi_rc_ != MPI_SUCCESS)                                             \
      ::accel::detail::throw_mpi_error(accel_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)
